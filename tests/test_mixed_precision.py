"""Mixed precision is the user's choice (DESIGN 15; issue 36): bf16 asked four ways (a plain loop under
``torch.autocast``, ``TrainingArguments(bf16=True)``, ``Accelerator(mixed_precision="bf16")``, Lightning's
``precision="bf16-mixed"``) runs under every strategy, computes in bfloat16, and trains like ``single`` within
bf16's tolerance; fp16 with a loss scaler runs where the strategy takes one, and is a mismatch where it does not."""

from __future__ import annotations

import os

import gpu_objectives
import hf_objectives
import lightning_objectives
import optuna
import pytest
from optuna.trial import TrialState
from support import run_on

pytestmark = pytest.mark.launch

#: Relative difference allowed between a strategy's loss curve and single's, step by step, under bf16 autocast.
#: Every strategy computes each row's products in bfloat16 as single does (8 bits of mantissa: a relative step of
#: 2^-8); what differs is the order of float32 sums (the ranks' gradients, the halves of a batch), which 12 steps of
#: AdamW carry on: measured at most 3.2e-5 here, over the four ways in and three strategies.
BF16_TOLERANCE = 1e-3
RUNS = [("single", 1), ("ddp", 2), ("fsdp", 2), ("zero2", 2)]
WAYS = {
    "plain loop": gpu_objectives.autocast_loop,
    "Trainer": hf_objectives.trainer_gpt2,
    "Accelerate": hf_objectives.accelerate_gpt2,
    "Lightning": lightning_objectives.lightning_gpt2,
}


def _run(objective, strategy: str, devices: int, logs, precision: str) -> optuna.trial.FrozenTrial:
    saved = os.environ.get("SATURN_TEST_PRECISION")
    os.environ["SATURN_TEST_PRECISION"] = precision  # (read by the objectives, in the workers forked after this)
    try:
        return run_on(objective, strategy, devices, logs, params={"learning_rate": 3e-3}).trials[0]
    finally:
        os.environ.pop("SATURN_TEST_PRECISION")
        if saved is not None:
            os.environ["SATURN_TEST_PRECISION"] = saved


@pytest.fixture(scope="module", params=list(WAYS))
def bf16_runs(request, tmp_path_factory):
    """The way in's one trial under each strategy, in bf16."""
    logs = tmp_path_factory.mktemp("bf16")
    trials = {f"{s}x{n}": _run(WAYS[request.param], s, n, logs, "bf16") for s, n in RUNS}
    single = trials["singlex1"].user_attrs.get("curve", [])
    for run, trial in trials.items():  # (shown with -s)
        curve = trial.user_attrs.get("curve", [])
        worst = max((abs(a - b) / abs(b) for a, b in zip(curve, single)), default=float("nan"))
        print(f"bf16 {request.param} {run}: worst relative loss-curve difference to singlex1 {worst:.1e}")
    return request.param, trials


@pytest.mark.parametrize("run", [f"{s}x{n}" for s, n in RUNS])
def test_bf16_runs_under_every_strategy_and_trains_like_single(bf16_runs, run):
    way, trials = bf16_runs
    reference, trial = trials["singlex1"], trials[run]
    assert trial.state == TrialState.COMPLETE, (way, run, trial.system_attrs.get("saturn:fail_reason"))
    assert trial.system_attrs["saturn:strategy"] == run.split("x")[0]
    assert trial.user_attrs["compute_dtypes"] == ["torch.bfloat16"], (way, run)  # autocast really on
    curve = trial.user_attrs["curve"]
    assert len(curve) == 12 and curve[-1] < curve[0], (way, run, curve)
    assert curve == pytest.approx(reference.user_attrs["curve"], rel=BF16_TOLERANCE), (way, run)
    assert trial.value == pytest.approx(reference.value, rel=BF16_TOLERANCE), (way, run)


def test_fp16_with_a_loss_scaler_runs_where_the_strategy_takes_one_and_is_a_mismatch_where_not(tmp_path):
    """A plain loop with torch.amp.GradScaler: under DDP the scaler sees the gradients as one process does; under
    FSDP it would see one rank's shards: the strategy refuses it by name (the planner would plan another)."""
    ddp = _run(gpu_objectives.autocast_loop, "ddp", 2, tmp_path, "fp16")
    assert ddp.state == TrialState.COMPLETE, ddp.system_attrs.get("saturn:fail_reason")
    assert ddp.user_attrs["compute_dtypes"] == ["torch.float16"]
    fsdp = _run(gpu_objectives.autocast_loop, "fsdp", 2, tmp_path, "fp16")
    assert fsdp.state == TrialState.FAIL
    assert "StrategyMismatch: fp16 with a loss scaler" in fsdp.system_attrs["saturn:fail_reason"]
