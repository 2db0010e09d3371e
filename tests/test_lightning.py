"""The Lightning way in: a ``LightningModule`` trained by ``trial.lightning_trainer(...)`` runs under the strategy
the sweep chose, really applied (FSDP shards, ZeRO is ZeRO) inside the warm workers' process group, and computes
what it computes on one device: the same loss curve and validation losses within 1e-4, with AdamW, a per-step LR
schedule and gradient clipping. Validations are the trial's reports; the study's pruner stops every rank."""

from __future__ import annotations

import lightning_objectives
import optuna
import pytest
from optuna.trial import TrialState
from support import assert_trains_like, run_on

from optuna_saturn import SaturnExecutor

pytestmark = pytest.mark.launch

TOLERANCE = 1e-4
RUNS = [("single", 1), ("ddp", 2), ("fsdp", 2), ("zero2", 2)]
PARAMS = {"learning_rate": 3e-3}


def _run(objective, strategy: str, devices: int, logs, *, pruner=None):
    return run_on(objective, strategy, devices, logs, params=PARAMS, pruner=pruner).trials[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    logs = tmp_path_factory.mktemp("lightning")
    trials = {}
    for strategy, devices in RUNS:
        trial = _run(lightning_objectives.lightning_gpt2, strategy, devices, logs)
        assert trial.state == TrialState.COMPLETE, (strategy, trial.system_attrs.get("saturn:fail_reason"))
        assert trial.system_attrs["saturn:strategy"] == strategy and trial.system_attrs["saturn:num_devices"] == devices
        trials[f"{strategy}x{devices}"] = trial
    return trials


@pytest.mark.parametrize("run", [f"{s}x{n}" for s, n in RUNS[1:]])
def test_the_same_lightning_trial_trains_the_same_under_every_strategy(runs, run):
    reference, result = runs["singlex1"], runs[run]
    assert_trains_like(reference, result, steps=12, rel=TOLERANCE)
    # each validation (every 3 steps) is a report at the global step, and the mean over all ranks' rows
    assert sorted(result.intermediate_values) == [3, 6, 9, 12]
    for step, value in reference.intermediate_values.items():
        assert result.intermediate_values[step] == pytest.approx(value, rel=TOLERANCE), step


def test_the_strategy_is_really_applied(runs):
    facts = {run: trial.user_attrs["facts"] for run, trial in runs.items()}
    assert facts["fsdpx2"]["sharded_params"] and facts["fsdpx2"]["local_fraction"] == pytest.approx(0.5, abs=0.05)
    assert facts["zero2x2"]["zero_stage"] == 2
    assert "sharded_params" not in facts["ddpx2"] and "zero_stage" not in facts["ddpx2"]
    assert facts["singlex1"]["optimizer"] == "AdamW"


def test_clipping_through_the_trainer_clips_under_zero(tmp_path, monkeypatch):
    """``gradient_clip_val`` clips: with SGD (Adam normalises the gradient's scale, which hides clipping) the
    unclipped trial trains otherwise; and under ZeRO-2, whose gradients live in DeepSpeed's partitions where
    Lightning's own clipping would find nothing, it clips as one process does."""
    monkeypatch.setenv("SATURN_TEST_OPTIMIZER", "sgd")
    clipped = {s: _run(lightning_objectives.lightning_gpt2, s, n, tmp_path) for s, n in (("single", 1), ("zero2", 2))}
    monkeypatch.setenv("SATURN_TEST_NO_CLIPPING", "1")
    unclipped = _run(lightning_objectives.lightning_gpt2, "single", 1, tmp_path)
    for trial in (*clipped.values(), unclipped):
        assert trial.state == TrialState.COMPLETE, trial.system_attrs.get("saturn:fail_reason")
    curve = clipped["single"].user_attrs["curve"]
    assert clipped["zero2"].user_attrs["curve"] == pytest.approx(curve, rel=TOLERANCE)
    assert unclipped.user_attrs["curve"][1:] != pytest.approx(curve[1:], rel=1e-3)


class _PruneAtOnce(optuna.pruners.BasePruner):
    def prune(self, study, trial) -> bool:
        return True


def test_a_pruned_lightning_trial_stops_every_rank(tmp_path):
    trial = _run(lightning_objectives.lightning_gpt2, "ddp", 2, tmp_path, pruner=_PruneAtOnce())
    assert trial.state == TrialState.PRUNED, trial.system_attrs.get("saturn:fail_reason")
    assert list(trial.intermediate_values) == [3]
    assert "curve" not in trial.user_attrs  # fit() ended at the first validation, on both ranks (or it would hang)


def test_lightning_is_profiled_through_its_optimizer_steps(tmp_path):
    executor = SaturnExecutor(
        devices=2,
        strategies=["single", "ddp"],
        isolate_network=True,
        log_dir=tmp_path / "runs",
        grace_period=5,
        profile_store=tmp_path / "profiles",
        progress=None,
        dashboard=False,
    )
    study = executor.profile(lightning_objectives.lightning_gpt2, n_trials=1)
    profiles = {p["strategy"]: p for p in study.trials[0].system_attrs["saturn:profiles"]}
    assert set(profiles) == {"single", "ddp"}
    assert all(p["feasible"] and 0 < p["step_seconds"] < 1 for p in profiles.values()), profiles


@pytest.mark.parametrize(
    "setting, words",
    [
        ({"strategy": "ddp"}, "strategy='ddp': remove it; list the strategies"),
        ({"devices": 2}, "each of the trial's processes drives one device"),
        ({"precision": "bf16-true"}, "a whole model in half precision"),
        ({"accelerator": "gpu"}, "the trial's devices decide"),
        (  # every conflict at once, not one per round of fixing
            {"strategy": "ddp", "devices": 2, "num_nodes": 2, "use_distributed_sampler": True},
            "Change these arguments:\n  - strategy='ddp'",
        ),
    ],
)
def test_trainer_settings_that_pick_the_strategy_are_refused_with_the_fix(tmp_path, monkeypatch, setting, words):
    """Refused when the script makes its Trainer, with the fix: an error of the objective, which ``optimize``
    raises (as ``study.optimize`` would: no trial runs after it)."""
    monkeypatch.setenv("SATURN_TEST_TRAINER_SETTING", repr(setting))
    with pytest.raises(ValueError) as refused:
        _run(lightning_objectives.lightning_gpt2, "single", 1, tmp_path)
    assert words in str(refused.value), str(refused.value)


def test_accumulation_that_deepspeed_cannot_follow_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("SATURN_TEST_TRAINER_SETTING", repr({"accumulate_grad_batches": 2}))
    refused = _run(lightning_objectives.lightning_gpt2, "zero2", 2, tmp_path)
    assert refused.state == TrialState.FAIL
    assert "counts micro-batches itself" in refused.system_attrs["saturn:fail_reason"]


def test_every_conflicting_argument_is_named_in_one_error():
    from optuna_saturn.integrations._lightning_arguments import refuse_conflicts

    with pytest.raises(ValueError) as raised:
        refuse_conflicts(
            {"strategy": "fsdp", "devices": 4, "num_nodes": 2, "accelerator": "tpu", "use_distributed_sampler": True},
            runs_as="the sweep picks each trial's strategy and devices",
            device_type=None,
        )
    named = [line.split(":")[0].strip(" -") for line in str(raised.value).splitlines()[1:]]
    assert named == ["strategy='fsdp'", "devices=4", "num_nodes=2", "accelerator='tpu'", "use_distributed_sampler=True"]
