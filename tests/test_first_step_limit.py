"""A first step is awaited for a limit too (issue 47, N11): a trial that never takes one is stopped after its
start-up limit, the stall limit plus the start-up's share of its planned runtime, and ends FAIL with a reason that
names the limit and how to raise it; its devices go to the next trial."""

from __future__ import annotations

import time

import objectives
import optuna
import pytest
from optuna.trial import TrialState
from test_policies import running, state_of

from optuna_saturn import SaturnExecutor
from optuna_saturn.planner import Option
from optuna_saturn.sweep import startup
from optuna_saturn.sweep.decisions import Stop
from optuna_saturn.sweep.faults import MIN_STALL_SECONDS, Faults


def test_the_start_up_limit_is_the_stall_limit_plus_the_planned_runtime_and_its_stop_says_how_to_raise_it():
    state = state_of(1)
    run = running(state, Option("single", 1, 300.0), (0,))
    derived = Faults(stall_timeout=None, max_retries=1, may_leave_out=False)
    assert startup.startup_limit(run, derived.stall_limit(run)) == max(MIN_STALL_SECONDS, 150.0) + 300.0
    run.waiting.moves.append({"setup": 40.0})  # (a moved run sets up again: twice its last set-up more)
    assert startup.startup_limit(run, 10.0) == 10.0 + 300.0 + 80.0
    faults = Faults(stall_timeout=10.0, max_retries=1, may_leave_out=False)
    assert faults.stalled(state, 389.0) == []
    [stop] = faults.stalled(state, 391.0)
    assert isinstance(stop, Stop) and stop.run is run
    assert "took no first step in 391 s (the start-up limit is 390 s" in stop.reason
    assert "stall_timeout=" in stop.reason and "docs/failures.md" in stop.reason


@pytest.mark.launch
@pytest.mark.timeout(90)  # (a trial left waiting would hold the device for an hour)
def test_a_trial_that_never_takes_its_first_step_ends_fail_after_its_start_up_limit_and_frees_its_device(
    saturn_options, tmp_path, monkeypatch
):
    """Trial 0 sleeps an hour before its loop; with the planned runtime's share at 0 its limit is the 2 s stall
    limit. It used to hold its device for the stall limit plus its whole planned runtime, and then read as a stall
    after steps ("reported no progress"), with no word of the start-up or how to give it more time."""
    monkeypatch.setattr(startup, "STARTUP_SHARE", 0.0)
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("SATURN_TEST_PIDS", str(pids))
    monkeypatch.setenv("SATURN_TEST_MISBEHAVE", "hang")
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.sqlite3'}")
    options = {**saturn_options, "profile": False, "stall_timeout": 2.0, "max_retries": 0}
    began = time.monotonic()
    SaturnExecutor(devices=1, strategies=["single"], **options).optimize(
        study, objectives.misbehaves_before_its_loop, n_trials=2
    )
    took = time.monotonic() - began
    hung, after = study.trials
    assert hung.state == TrialState.FAIL
    reason = hung.system_attrs.get("saturn:fail_reason") or hung.user_attrs.get("saturn:fail_reason", "")
    assert "took no first step in" in reason and "the start-up limit is 2 s" in reason, reason
    assert "stall_timeout=" in reason, reason
    assert after.state == TrialState.COMPLETE  # (the one device went to the next trial)
    assert after.datetime_start >= hung.datetime_complete
    assert took < 60, took
