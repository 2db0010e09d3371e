"""The code users write for one process, run unchanged under every strategy: it computes what it computes under
``single`` (within float reduction order), or it is refused with an error that names the fix.

The matrix: every strategy x {AdamW, Adam, SGD with momentum, Adafactor from transformers} x {an LR scheduler
(made before ``prepare`` for Adam(W), after it otherwise), gradient clipping} x {a user's own sampler drawing from
the global generator, an ``IterableDataset``}; plus saving the model and exact evaluation on a short last batch.
Each strategy runs all its cases in one launch.
"""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

import objectives
from optuna_saturn import SaturnExecutor
from optuna_saturn.strategy import load_strategies

pytestmark = pytest.mark.launch

TOLERANCE = 1e-4
STRATEGIES = sorted(load_strategies())
SHARDED = {"fsdp", "fsdp-ckpt", "fsdp-offload", "zero3", "zero3-offload"}


def _refused(strategy: str, case: str) -> bool:
    """Adafactor factorises each parameter's shape: ZeRO flattens parameters, FSDP shards them as DTensors."""
    return case.startswith("Adafactor/") and (strategy.startswith("zero") or strategy.startswith("fsdp"))


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    logs = tmp_path_factory.mktemp("user-code")
    results = {}
    for name in STRATEGIES:
        study = optuna.create_study()
        SaturnExecutor(
            devices=1 if name.startswith("single") else 2, strategies=[name], isolate_network=True, log_dir=logs,
            grace_period=5, profile=False, progress=None, dashboard=False,
        ).optimize(study, objectives.user_code_matrix, n_trials=1)
        trial = study.trials[0]
        assert trial.state == TrialState.COMPLETE, (name, trial.user_attrs.get("saturn:fail_reason"))
        results[name] = trial.user_attrs["results"]
    return results


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != "single"])
@pytest.mark.parametrize("case", objectives.USER_CODE_CASES)
def test_user_code_matches_single_or_names_the_fix(matrix, strategy, case):
    reference, result = matrix["single"][case], matrix[strategy][case]
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
    single = matrix["single"]
    assert all(max(single[c]["norms"]) > 0.05 for c in objectives.USER_CODE_CASES if "/clipping/" in c)
    assert all(len(set(single[c]["lrs"])) > 1 for c in objectives.USER_CODE_CASES if "/scheduler/" in c)


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != "single"])
def test_saving_and_exact_evaluation_under_every_strategy(matrix, strategy):
    reference, result = matrix["single"]["saving-and-evaluating"], matrix[strategy]["saving-and-evaluating"]
    assert result["saved"].keys() == reference["saved"].keys()
    for key, values in reference["saved"].items():  # trial.state_dict(model): the whole model, on rank 0
        assert result["saved"][key] == pytest.approx(values, rel=TOLERANCE, abs=1e-6), key
    assert len(result["gathered"]) == 13  # every row once: the one repeated in the last batch is left out
    assert result["gathered"] == pytest.approx(reference["gathered"], rel=TOLERANCE, abs=1e-7)
    if strategy in SHARDED:
        assert "trial.state_dict(model)" in result["unwrap"]  # refused, naming what works
    else:
        assert result["unwrap"] == "ok"
