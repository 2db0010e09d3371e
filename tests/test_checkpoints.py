"""A trial that checkpoints survives its sweep's death: the sweep that runs it again resumes from its latest
checkpoint, under whichever option the planner picks (torch.distributed.checkpoint reshards), and ends where an
uninterrupted run ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import objectives
import optuna
import psutil
import pytest
from optuna.trial import TrialState
from support import kill_a_worker_once

from optuna_saturn import SaturnExecutor

HERE = os.path.dirname(__file__)
STEPS = objectives.RESUMABLE_EPOCHS * 4  # 64 rows in batches of 16
HANG_AT = 20  # the first run reports at 20, its latest checkpoint is at 16
PARAMS = {"lr": 0.02}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The trial the tests kill, run once uninterrupted under single x1, for every case of the module: under each
    option they resume under it ends where this run ends (ddp x2, fsdp x4, zero2 x2 and x4, zero3 x4 run
    uninterrupted differ from it by under 4e-7, against the 1e-4 the tests allow). Called with the test's
    ``saturn_options``: it runs in a loopback-only network namespace as every launch does."""
    done: list[optuna.trial.FrozenTrial] = []  # (run by the first test that asks, with its options)

    def run(saturn_options) -> optuna.trial.FrozenTrial:
        if not done:
            study = optuna.create_study()
            study.enqueue_trial(PARAMS)
            options = {**saturn_options, "log_dir": tmp_path_factory.mktemp("reference")}
            SaturnExecutor(devices=1, strategies=["single"], **options).optimize(
                study, objectives.resumable, n_trials=1
            )
            done.append(study.trials[0])
        return done[0]

    return run


def _killed_after_its_checkpoint(storage: str, log_dir: Path, strategy: str, devices: int) -> optuna.trial.FrozenTrial:
    """Run the study's trial in a sweep of its own until it has checkpointed at step 16 and reported step 20, then
    kill -9 that sweep. Returns the trial as the dead sweep left it."""
    sweep = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "sweep_to_kill.py"), storage, str(log_dir), strategy, str(devices)],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]),
            "SATURN_TEST_HANG_AT": str(HANG_AT),
        },
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            assert sweep.poll() is None and time.monotonic() < deadline, "the sweep did not get to its checkpoint"
            trial = optuna.load_study(study_name="killed", storage=storage).trials[0]
            if HANG_AT in trial.intermediate_values and "saturn:checkpoint" in trial.system_attrs:
                break
            time.sleep(0.2)
        descendants = psutil.Process(sweep.pid).children(recursive=True)
    finally:
        sweep.send_signal(signal.SIGKILL)
        sweep.wait(timeout=30)
    psutil.wait_procs(descendants, timeout=30)
    return optuna.load_study(study_name="killed", storage=storage).trials[0]


@pytest.mark.launch
@pytest.mark.parametrize(
    ("first", "then"),
    [
        (("fsdp", 2), ("single", 1)),  # sharded on 2 ranks, loaded whole into one process
        (("single", 1), ("ddp", 2)),
        (("fsdp", 2), ("fsdp", 4)),  # resharded from 2 ranks to 4 (4 devices sharing 2 cores here)
        (("zero2", 2), ("zero2", 2)),  # DeepSpeed's own checkpoint, on as many ranks
        (("zero2", 2), ("zero2", 4)),  # DeepSpeed's universal checkpoint: resharded from 2 ranks to 4
        (("zero3", 2), ("zero3", 4)),  # the same for ZeRO-3's partitioned parameters
    ],
    ids=lambda o: f"{o[0]}x{o[1]}",
)
def test_a_trial_killed_with_its_sweep_resumes_from_its_checkpoint(
    saturn_options, tmp_path, uninterrupted, first, then
):
    reference = uninterrupted(saturn_options)
    assert reference.state == TrialState.COMPLETE

    storage = f"sqlite:///{tmp_path / 'study.sqlite3'}"
    optuna.create_study(study_name="killed", storage=storage).enqueue_trial(PARAMS)
    dead = _killed_after_its_checkpoint(storage, tmp_path / "first", *first)
    record = dead.system_attrs["saturn:checkpoint"]
    assert dead.state == TrialState.RUNNING and record["step"] == 16 and record["strategy"] == first[0]
    assert Path(record["path"]).is_dir()

    study = optuna.load_study(study_name="killed", storage=storage)
    options = {**saturn_options, "log_dir": tmp_path / "first"}  # (run again as it was: its checkpoints are there)
    SaturnExecutor(devices=then[1], strategies=[then[0]], allow_shared_cores=True, **options).optimize(
        study, objectives.resumable, n_trials=0
    )

    trials = optuna.load_study(study_name="killed", storage=storage).trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    retry = trials[1]
    assert retry.user_attrs["saturn:retry_of"] == 0 and retry.user_attrs["started_at_step"] == 16
    assert retry.system_attrs["saturn:resumed_from_step"] == 16
    assert retry.system_attrs["saturn:strategy"] == then[0]
    # The steps the first run reported are kept, once each; the run again adds those after them, and ends where an
    # uninterrupted run of the same params ends (the checkpoint fell at an epoch's end: the same batches follow; the
    # options compute the same global batch's mean, so single's uninterrupted run is every option's, within 1e-4).
    assert sorted(retry.intermediate_values) == list(range(4, STEPS + 1, 4))
    assert retry.intermediate_values[HANG_AT] == dead.intermediate_values[HANG_AT]
    for step in range(HANG_AT + 4, STEPS + 1, 4):
        assert retry.intermediate_values[step] == pytest.approx(reference.intermediate_values[step], rel=1e-4)
    assert retry.value == pytest.approx(reference.value, rel=1e-4)
    print(
        f"{first} -> {then}: resumed value {retry.value!r}, uninterrupted {reference.value!r}, "
        f"relative difference {abs(retry.value - reference.value) / reference.value:.1e}"
    )
    assert not Path(record["path"]).exists()  # a trial that ended needs its checkpoints no more


@pytest.mark.launch
@pytest.mark.parametrize("fault", ["a rank hangs", "a rank is killed"])
def test_a_trial_whose_rank_dies_or_hangs_is_run_again_from_its_checkpoint(
    saturn_options, tmp_path, monkeypatch, fault
):
    storage = f"sqlite:///{tmp_path / 'study.sqlite3'}"
    study = optuna.create_study(study_name="faults", storage=storage)
    study.enqueue_trial({"lr": 0.02})
    monkeypatch.setenv("SATURN_TEST_HANG_AT", str(HANG_AT))  # (the first run only)
    stall_timeout = 3.0 if fault == "a rank hangs" else None
    killer = None
    if fault == "a rank is killed":  # once it hangs after its checkpoint, its rank 1 (rank 0 then waits for it
        # no more than the pool's grace period)
        killer = kill_a_worker_once(storage, "faults", "saturn-worker-1", lambda t: HANG_AT in t.intermediate_values)
    SaturnExecutor(devices=2, strategies=["ddp"], stall_timeout=stall_timeout, **saturn_options).optimize(
        study, objectives.resumable, n_trials=1
    )
    if killer is not None:
        killer.join(timeout=5)

    first, again = optuna.load_study(study_name="faults", storage=storage).trials  # n_trials counts new trials
    assert first.state == TrialState.FAIL
    reason = first.system_attrs["saturn:fail_reason"]
    if stall_timeout:
        assert "reported no progress for" in reason, reason
    else:  # ended on the death itself, not by the stall limit (120 s) long after
        assert "the worker of device 1 died" in reason and "no progress" not in reason, reason
    assert again.state == TrialState.COMPLETE and again.params == first.params
    assert again.user_attrs["saturn:retry_of"] == 0 and again.system_attrs["saturn:resumed_from_step"] == 16
    assert sorted(again.intermediate_values) == list(range(4, STEPS + 1, 4))


def test_stall_timeout_is_checked():
    with pytest.raises(ValueError, match="stall_timeout must be a positive number"):
        SaturnExecutor(devices=1, strategies=["single"], stall_timeout=0)


@pytest.mark.launch
def test_a_trial_out_of_memory_at_run_time_goes_on_from_its_checkpoint_under_another_option(
    saturn_options, monkeypatch
):
    study = optuna.create_study()
    study.enqueue_trial({"lr": 0.02})
    monkeypatch.setenv("SATURN_TEST_OOM_AT", str(HANG_AT))  # under ddp x2, after its checkpoint at 16
    SaturnExecutor(devices=2, strategies=["ddp", "single"], **saturn_options).optimize(
        study, objectives.resumable, n_trials=1, batch_size=1
    )
    (trial,) = study.trials  # the same trial, planned again: not a new one
    assert trial.state == TrialState.COMPLETE, trial.system_attrs.get("saturn:fail_reason")
    # another option: single, or ddp with more micro-batches per step (the same global batch in less memory)
    option = (trial.system_attrs["saturn:strategy"], trial.system_attrs["saturn:gradient_accumulation"])
    assert option != ("ddp", 1), option
    assert trial.system_attrs["saturn:resumed_from_step"] == 16
    assert trial.user_attrs["started_at_step"] == 16
    assert sorted(trial.intermediate_values) == list(range(4, STEPS + 1, 4))


@pytest.mark.parametrize("own_generator", [False, True], ids=["global-generator", "loader-generator"])
@pytest.mark.parametrize("cut", [3, 5], ids=["mid-pass", "between-passes"])
def test_a_loader_resumed_mid_pass_yields_the_rest_of_that_pass_and_then_draws_as_before(own_generator, cut):
    """What a checkpoint saves of a prepared loader: a run that goes on from it sees the batches the first run saw
    next, in this pass and the following one (whose order is drawn from the generators as the first run's was)."""
    import torch

    from optuna_saturn.training.loader_positions import PositionedLoader
    from optuna_saturn.training.random_state import capture, restore

    def loader():
        generator = torch.Generator().manual_seed(1) if own_generator else None
        return PositionedLoader(
            torch.utils.data.DataLoader(objectives.regression_data(40), batch_size=8, shuffle=True, generator=generator)
        )

    torch.manual_seed(3)
    first = loader()
    batches = iter(first)
    seen = [next(batches)[0] for _ in range(cut)]
    if cut == 5:  # the pass is over once the loop asks for more
        assert next(batches, None) is None
    position, states = first.position(), capture()  # what a checkpoint after step ``cut`` keeps
    rest = [b[0] for b in batches] + [b[0] for b in first]  # the first run goes on: its pass, then the next one
    if cut == 3:
        assert position["yielded"] == 3

    torch.manual_seed(99)  # another process, anywhere
    resumed = loader()
    restore(states)
    resumed.resume_at(position)
    again = [b[0] for b in resumed] + [b[0] for b in resumed]
    if cut == 5:
        again = again[:5]  # (one pass: the first run's next)
    assert len(again) == len(rest) == (2 + 5 if cut == 3 else 5)
    for a, b in zip(again, rest):
        assert torch.equal(a, b)
    assert not any(torch.equal(again[0], s) for s in seen)
