"""The Hugging Face ways in: a ``transformers.Trainer`` objective (``trial.prepare_trainer``) and an Accelerate
script (``trial.accelerator()``) run under the strategy the sweep chose, really applied (FSDP shards, ZeRO is
ZeRO), and compute what they compute in one process: the same loss curve within 1e-4."""

from __future__ import annotations

import hf_objectives
import optuna
import pytest
import torch
from optuna.trial import TrialState
from support import assert_trains_like, run_on

from optuna_saturn import SaturnExecutor

pytestmark = pytest.mark.launch

TOLERANCE = 1e-4
RUNS = [("single", 1), ("ddp", 2), ("fsdp", 2), ("zero2", 2), ("zero3", 2)]
PARAMS = {"learning_rate": 3e-3}


def _run(objective, strategy: str, devices: int, logs, *, profile: bool = False, pruner=None, n_trials: int = 1):
    return run_on(objective, strategy, devices, logs, params=PARAMS, n_trials=n_trials, profile=profile, pruner=pruner)


@pytest.fixture(scope="module", params=["trainer_gpt2", "accelerate_gpt2"])
def runs(request, tmp_path_factory):
    """Each strategy's one trial of the objective, as the study holds it."""
    logs = tmp_path_factory.mktemp(request.param)
    objective = getattr(hf_objectives, request.param)
    trials = {}
    for strategy, devices in RUNS:
        trial = _run(objective, strategy, devices, logs).trials[0]
        assert trial.state == TrialState.COMPLETE, (strategy, trial.system_attrs.get("saturn:fail_reason"))
        assert trial.system_attrs["saturn:strategy"] == strategy and trial.system_attrs["saturn:num_devices"] == devices
        trials[f"{strategy}x{devices}"] = trial
    single = trials["singlex1"].user_attrs["curve"]
    for run, trial in trials.items():  # (shown with -s)
        worst = max(abs(a - b) / abs(b) for a, b in zip(trial.user_attrs["curve"], single))
        print(f"{request.param} {run}: worst relative loss-curve difference to singlex1 {worst:.1e}")
    return trials


@pytest.mark.parametrize("run", [f"{s}x{n}" for s, n in RUNS[1:]])
def test_the_same_trial_trains_the_same_under_every_strategy(runs, run):
    reference, result = runs["singlex1"], runs[run]
    assert_trains_like(reference, result, steps=12, rel=TOLERANCE)
    # what the study is told, and every evaluation on the way: the same value under every strategy
    assert result.value == pytest.approx(reference.value, rel=1e-5)
    if "eval_losses" in reference.user_attrs:
        assert result.user_attrs["eval_losses"] == pytest.approx(reference.user_attrs["eval_losses"], rel=1e-5)
    assert result.user_attrs["grad_norms"] == pytest.approx(reference.user_attrs["grad_norms"], rel=TOLERANCE)
    assert max(reference.user_attrs["grad_norms"]) > 0.5  # clipping clipped


def test_the_strategy_is_really_applied(runs):
    facts = {run: trial.user_attrs["facts"] for run, trial in runs.items()}
    assert facts["fsdpx2"]["sharded_params"] and facts["fsdpx2"]["local_fraction"] == pytest.approx(0.5, abs=0.05)
    assert facts["zero2x2"]["zero_stage"] == 2 and facts["zero3x2"]["zero_stage"] == 3
    assert "sharded_params" not in facts["ddpx2"] and "zero_stage" not in facts["ddpx2"]
    assert facts["singlex1"]["optimizer"] == "AdamW"


def test_evaluations_are_reported_and_a_trainer_writes_to_a_folder_per_trial(runs):
    for run, trial in runs.items():
        reported = [trial.intermediate_values[step] for step in sorted(trial.intermediate_values)]
        if "eval_losses" not in trial.user_attrs:  # the Accelerate script reports once per epoch
            assert sorted(trial.intermediate_values) == [0, 1] and reported[-1] == pytest.approx(trial.value), run
            continue
        # Trainer: each evaluation at its global step (the final evaluate() repeats step 12: reported once)
        assert sorted(trial.intermediate_values) == [3, 6, 9, 12], run
        assert reported == pytest.approx(trial.user_attrs["eval_losses"][:4], rel=1e-12), run
        assert trial.user_attrs["output_dir"].endswith(f"trial-{trial.number}"), run


class _PruneAtOnce(optuna.pruners.BasePruner):
    def prune(self, study, trial) -> bool:
        return True


def test_a_pruned_trainer_trial_stops_every_rank(tmp_path):
    study = _run(hf_objectives.trainer_gpt2, "ddp", 2, tmp_path, pruner=_PruneAtOnce())
    trial = study.trials[0]
    assert trial.state == TrialState.PRUNED, trial.system_attrs.get("saturn:fail_reason")
    assert list(trial.intermediate_values) == [3]


@pytest.mark.parametrize("objective", ["trainer_gpt2", "accelerate_gpt2"])
def test_both_ways_in_are_profiled_without_a_trial_steps_loop(tmp_path, objective):
    """The trainer's optimizer steps, or the prepared training DataLoader's batches, are the timed steps."""
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
    study = executor.profile(getattr(hf_objectives, objective), n_trials=1)
    profiles = {p["strategy"]: p for p in study.trials[0].system_attrs["saturn:profiles"]}
    assert set(profiles) == {"single", "ddp"}
    assert all(p["feasible"] and 0 < p["step_seconds"] < 1 for p in profiles.values()), profiles


def test_strategy_settings_of_the_script_are_refused_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(ValueError) as refused:  # (the objective's error: optimize raises it, as study.optimize)
        _run(hf_objectives.accelerate_gpt2, "single", 1, tmp_path)
    reason = str(refused.value)
    assert "ACCELERATE_USE_FSDP" in reason and "optuna-saturn's choice" in reason


def test_trainer_gradient_accumulation_is_followed_or_refused(tmp_path, monkeypatch):
    """Trainer's own accumulation (2 batches per optimizer step): DDP and FSDP skip the synchronisation of the
    first and train as one process does; DeepSpeed, which counts micro-batches itself, refuses with the reason."""
    monkeypatch.setenv("SATURN_TEST_ACCUMULATION", "2")
    curves = {}
    for strategy, devices in (("single", 1), ("ddp", 2), ("fsdp", 2)):
        trial = _run(hf_objectives.trainer_gpt2, strategy, devices, tmp_path).trials[0]
        assert trial.state == TrialState.COMPLETE, (strategy, trial.system_attrs.get("saturn:fail_reason"))
        curves[strategy] = trial.user_attrs["curve"]
    assert len(curves["single"]) == 6  # 12 batches, 2 per step
    assert curves["ddp"] == pytest.approx(curves["single"], rel=TOLERANCE)
    assert curves["fsdp"] == pytest.approx(curves["single"], rel=TOLERANCE)
    refused = _run(hf_objectives.trainer_gpt2, "zero2", 2, tmp_path).trials[0]
    assert refused.state == TrialState.FAIL
    assert "counts micro-batches itself" in refused.system_attrs["saturn:fail_reason"]


def test_a_plain_accelerator_runs_only_where_it_cannot_pretend(tmp_path):
    """Accelerate's own Accelerator() would run DDP whatever the sweep chose: refused under every strategy but
    single, with the fix named; on one device under single it is the user's one-process code."""
    refused = _run(hf_objectives.plain_accelerator, "fsdp", 2, tmp_path).trials[0]
    assert refused.state == TrialState.FAIL
    reason = refused.system_attrs["saturn:fail_reason"]
    assert "StrategyMismatch" in reason and "trial.accelerator()" in reason and "'fsdp'" in reason
    ran = _run(hf_objectives.plain_accelerator, "single", 1, tmp_path).trials[0]
    assert ran.state == TrialState.COMPLETE, ran.system_attrs.get("saturn:fail_reason")


def test_accelerate_state_of_the_executors_process_does_not_reach_the_workers(tmp_path):
    """The pool host may be a fork of this process. Accelerate state set up here (describing a Trainer objective
    does; so does a user's own code) would tell a worker's accelerator that it runs alone: its rank would skip
    the collectives its peer waits in, or reduce nothing. Workers start from a clean library state."""
    from accelerate.state import PartialState

    PartialState(cpu=True)  # this process: one process, no distribution
    try:
        attrs = {
            s: _run(hf_objectives.accelerate_gpt2, s, n, tmp_path).trials[0].user_attrs
            for s, n in (("single", 1), ("ddp", 2))
        }
        # ...and describing the trials (here, in this process) put this process's own state back, not reset it
        assert PartialState._shared_state and PartialState().num_processes == 1
    finally:
        PartialState._reset_state()
    assert attrs["ddp"]["accelerate_processes"] == 2
    assert attrs["ddp"]["curve"] == pytest.approx(attrs["single"]["curve"], rel=TOLERANCE)


class PlainTrial(optuna.trial.FixedTrial):
    """The objective's trial as plain Optuna would give it in one process: ``prepare_trainer`` hands the Trainer
    back as it is."""

    device = torch.device("cpu")

    def prepare_trainer(self, trainer, **kwargs):
        return trainer


@pytest.mark.parametrize("dropout", ["0", "0.1"])
def test_single_trains_exactly_as_a_plain_trainer_in_one_process(tmp_path, monkeypatch, dropout):
    """The strategy is ours, the training is the user's: under ``single`` the Trainer objective gives exactly
    what the same Trainer gives in one process without optuna-saturn (the same batches in the same order, each
    pass's shuffle from the seed, the evaluation weighing the last, smaller batch by its rows), with or without
    dropout: every training loss, every evaluation and the value told, bit for bit."""
    monkeypatch.setenv("SATURN_TEST_DROPOUT", dropout)
    monkeypatch.setenv("SATURN_TEST_OUTPUT", str(tmp_path / "plain"))
    plain = PlainTrial(PARAMS)
    value = hf_objectives.trainer_gpt2(plain)
    monkeypatch.setenv("SATURN_TEST_OUTPUT", str(tmp_path / "saturn"))
    (trial,) = _run(hf_objectives.trainer_gpt2, "single", 1, tmp_path / "logs").trials
    assert trial.state == TrialState.COMPLETE, trial.system_attrs.get("saturn:fail_reason")
    assert trial.user_attrs["curve"] == plain.user_attrs["curve"]
    assert trial.user_attrs["eval_losses"] == plain.user_attrs["eval_losses"]
    assert trial.value == value
