"""The code users write for one process, run unchanged under every strategy: it computes what it computes under
``single`` (within float reduction order), or it is refused with an error that names the fix.

The matrix: every strategy x {AdamW, Adam, SGD with momentum, Adafactor from transformers} x {an LR scheduler
(made before ``prepare`` for Adam(W), after it otherwise), gradient clipping} x {a user's own sampler drawing from
the global generator, an ``IterableDataset``}; plus saving the model and exact evaluation on a short last batch.
Each strategy runs all its cases in one launch.
"""

from __future__ import annotations

import objectives
import pytest
from optuna.trial import TrialState
from support import run_on

from optuna_saturn.strategy import load_strategies

pytestmark = pytest.mark.launch

TOLERANCE = 1e-4
#: Every strategy at every device count it allows on this 2-device pool (zero3-offload runs on 1 and 2).
RUNS = [(name, n) for name, strategy in sorted(load_strategies().items()) for n in strategy.device_counts(2)]
COMPARED = [f"{name}x{n}" for name, n in RUNS if (name, n) != ("single", 1)]
SHARDED = {"fsdp", "fsdp-ckpt", "fsdp-offload", "zero3", "zero3-offload"}


def _refused(strategy: str, case: str) -> bool:
    """Adafactor factorises each parameter's shape: ZeRO flattens parameters, FSDP shards them as DTensors."""
    return case.startswith("Adafactor/") and (strategy.startswith("zero") or strategy.startswith("fsdp"))


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    logs = tmp_path_factory.mktemp("user-code")
    results = {}
    for name, devices in RUNS:
        trial = run_on(objectives.user_code_matrix, name, devices, logs).trials[0]
        assert trial.state == TrialState.COMPLETE, (name, devices, trial.system_attrs.get("saturn:fail_reason"))
        assert trial.system_attrs["saturn:num_devices"] == devices
        results[f"{name}x{devices}"] = trial.user_attrs["results"]
    for run, cases in results.items():  # (shown with -s: how far each run is from single's loss curves)
        worst = max(
            (
                abs(a - b) / abs(b)
                for case, r in cases.items()
                if "curve" in r
                for a, b in zip(r["curve"], results["singlex1"][case]["curve"])
            ),
            default=float("nan"),
        )
        print(f"{run}: worst relative loss-curve difference to singlex1 {worst:.1e}")
    return results


@pytest.mark.parametrize("run", COMPARED)
@pytest.mark.parametrize("case", objectives.USER_CODE_CASES)
def test_user_code_matches_single_or_names_the_fix(matrix, run, case):
    strategy = run.rsplit("x", 1)[0]
    reference, result = matrix["singlex1"][case], matrix[run][case]
    assert "error" not in reference, reference
    if _refused(strategy, case):
        assert "StrategyMismatch" in result.get("error", ""), result
        assert "strategies=[...]" in result["error"] and "leaves this strategy out" in result["error"]
        return
    assert "error" not in result, result["error"]
    assert len(result["curve"]) == len(reference["curve"]) == 6  # 2 epochs of 3 batches (16, 16, 13 rows)
    assert result["curve"] == pytest.approx(reference["curve"], rel=TOLERANCE)
    assert result["lrs"] == pytest.approx(reference["lrs"], rel=1e-12)  # the scheduler drives the real optimizer
    assert result["norms"] == pytest.approx(reference["norms"], rel=TOLERANCE)  # the norm over all ranks' grads
    assert result["curve"][-1] < result["curve"][0]


def test_the_matrix_checks_what_it_claims(matrix):
    """Clipping really clips (norms over the limit), schedulers really move the learning rate."""
    single = matrix["singlex1"]
    assert all(max(single[c]["norms"]) > 0.05 for c in objectives.USER_CODE_CASES if "/clipping/" in c)
    assert all(len(set(single[c]["lrs"])) > 1 for c in objectives.USER_CODE_CASES if "/scheduler/" in c)


@pytest.mark.parametrize("run", COMPARED)
def test_saving_and_exact_evaluation_under_every_strategy(matrix, run):
    strategy = run.rsplit("x", 1)[0]
    reference, result = matrix["singlex1"]["saving-and-evaluating"], matrix[run]["saving-and-evaluating"]
    assert result["saved"].keys() == reference["saved"].keys()
    for key, values in reference["saved"].items():  # trial.state_dict(model): the whole model, on rank 0
        assert result["saved"][key] == pytest.approx(values, rel=TOLERANCE, abs=1e-6), key
    assert len(result["gathered"]) == 13  # every row once: the one repeated in the last batch is left out
    assert result["gathered"] == pytest.approx(reference["gathered"], rel=TOLERANCE, abs=1e-7)
    if strategy in SHARDED:
        assert "trial.state_dict(model)" in result["unwrap"]  # refused, naming what works
    else:
        assert result["unwrap"] == "ok"
