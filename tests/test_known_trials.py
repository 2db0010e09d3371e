"""Trials from the study's queue (``enqueue_trial``), their parameters all fixed, are known before they run: the
sweep describes them from the queue and plans them as a set, and takes each from the queue only as it starts it,
so the ones it never started stay there."""

from __future__ import annotations

import time

import objectives
import optuna
import pytest
from optuna.trial import TrialState

from optuna_saturn import SaturnExecutor

pytestmark = pytest.mark.launch


def _executor(saturn_options, **options) -> SaturnExecutor:
    return SaturnExecutor(devices=2, strategies=["single"], **{**saturn_options, **options})


def test_a_long_trial_enqueued_last_starts_first(saturn_options):
    """Four short trials, then a long one, on two devices. First come, first served puts the long one last (a
    makespan of 2 + 4 = 6 short-trial lengths); planned as a set, it starts at once (4 lengths)."""
    study = optuna.create_study()
    for steps in (5, 5, 5, 5, 20):
        study.enqueue_trial({"steps": steps, "sample_lr": False})
    _executor(saturn_options).optimize(study, objectives.counted_steps, n_trials=5)

    trials = study.trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 5
    starts = sorted(t.system_attrs["saturn:actual_start"] for t in trials)
    assert trials[4].system_attrs["saturn:actual_start"] <= starts[1]  # the long trial is among the first two
    longest, short = (
        trials[4].system_attrs["saturn:actual_runtime"],
        [t.system_attrs["saturn:actual_runtime"] for t in trials[:4]],
    )
    makespan = max(t.system_attrs["saturn:actual_end"] for t in trials) - starts[0]
    assert makespan < longest + min(short), (makespan, longest, short)  # not long + two short ones


def test_trials_of_the_queue_that_sample_are_asked_by_the_look_ahead(saturn_options):
    """A queued trial that samples a parameter of its own is the sampler's business: the queue's next trials
    are asked as devices free, not all at once."""
    study = optuna.create_study()
    for _ in range(4):
        study.enqueue_trial({"steps": 3, "sample_lr": True})
    SaturnExecutor(devices=1, strategies=["single"], **saturn_options).optimize(
        study, objectives.counted_steps, n_trials=4, batch_size=1
    )
    trials = study.trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    assert all("lr" in t.params for t in trials)
    assert trials[3].datetime_start > trials[0].datetime_complete  # asked later, not with the first


def test_a_timeout_leaves_the_queued_trials_it_never_started_in_the_queue(saturn_options):
    """The sweep's timeout comes while most queued trials wait: they stay in the queue (WAITING, not FAIL),
    and the next optimize runs them with the parameters they were enqueued with."""
    study = optuna.create_study()
    for steps in range(3, 11):
        study.enqueue_trial({"steps": steps, "sample_lr": False})
    SaturnExecutor(devices=1, strategies=["single"], **saturn_options).optimize(
        study, objectives.counted_steps, timeout=4.0
    )
    states = [t.state for t in study.trials]
    assert TrialState.FAIL not in states and TrialState.RUNNING not in states, states
    assert 1 <= states.count(TrialState.COMPLETE) < 8
    assert states.count(TrialState.WAITING) == 8 - states.count(TrialState.COMPLETE)

    _executor(saturn_options).optimize(study, objectives.counted_steps, n_trials=states.count(TrialState.WAITING))
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 8, (states, study.trials)
    assert sorted(t.value for t in study.trials) == [float(s) for s in range(3, 11)]


def test_a_timeout_that_comes_while_the_workers_start_still_runs_the_first_trials(saturn_options):
    """Plain Optuna's first trials start at once, and its timeout lets them finish. Here the timeout passes before
    the pool's workers are up: the trials planned to start first, one per device, still run; the others stay in
    the queue."""
    study = optuna.create_study()
    for steps in (3, 4, 5, 6):
        study.enqueue_trial({"steps": steps, "sample_lr": False})
    started = time.time()
    _executor(saturn_options).optimize(study, objectives.counted_steps, timeout=0.2)
    first_start = min((t.datetime_start.timestamp() for t in study.trials if t.datetime_start), default=None)
    assert first_start is not None and first_start - started > 0.2  # the timeout passed before any trial started
    states = [t.state for t in study.trials]
    assert states.count(TrialState.COMPLETE) == 2 and states.count(TrialState.WAITING) == 2, states


def test_an_interrupt_leaves_the_queued_trials_it_never_started_in_the_queue(saturn_options):
    """Ctrl-C (here, from a callback) fails the trials that ran, with the reason; the queued ones that waited
    stay in the queue."""
    study = optuna.create_study()
    for _ in range(6):
        study.enqueue_trial({"steps": 4, "sample_lr": False})

    def interrupt(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _executor(saturn_options).optimize(study, objectives.counted_steps, n_trials=6, callbacks=[interrupt])
    states = [t.state for t in study.trials]
    assert TrialState.RUNNING not in states, states
    assert states.count(TrialState.WAITING) >= 3, states
    assert states.count(TrialState.COMPLETE) >= 1
    failed = [t for t in study.trials if t.state == TrialState.FAIL]  # (the one still running, if any)
    assert all("interrupted" in t.system_attrs["saturn:fail_reason"] for t in failed), failed
