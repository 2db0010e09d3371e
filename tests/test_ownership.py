"""A sweep that dies leaves no trial RUNNING for ever: the next sweep ends its trials FAIL with the reason and runs
their params again; trials of a live sweep, and trials no sweep owns, are left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import objectives
import optuna
import psutil
import pytest
import sqlalchemy.exc
from optuna.trial import TrialState
from support import kill_a_worker_once

from optuna_saturn import SaturnExecutor
from optuna_saturn.study import liveness
from optuna_saturn.study.gateway import StudyGateway
from optuna_saturn.study.liveness import HeartbeatWatch
from optuna_saturn.study.ownership import Owner, recover_orphans

HERE = os.path.dirname(__file__)
STALE = liveness.STALE_AFTER_SECONDS


def _rounds(start: float, until: float) -> list[float]:
    """The times of the recoveries after ``start``, every 30 s, and one at ``start + until``."""
    return [start + t for t in range(30, int(until) - 1, 30)] + [start + until]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_only_the_trials_of_a_sweep_that_is_gone_are_ended_and_enqueued_again(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.sqlite3'}")
    me = Owner.of_this_process()
    here = (me.boot, me.pid_namespace)
    parent = psutil.Process(os.getppid())
    live = Owner("live-sweep", me.host, parent.pid, parent.create_time(), *here)  # a sweep in a process that runs
    dead = Owner("dead-sweep", me.host, _dead_pid(), me.started, *here)
    reused = Owner("reused-pid", me.host, parent.pid, me.started - 100, *here)  # its pid, another process's start
    far = Owner("far-sweep", "another-host", 1, 0.0)  # another host: judged by its heartbeat alone
    far_stale = Owner("far-stale", "another-host", 1, 0.0)
    # this host, but another PID namespace (another container): its pid means nothing here, its heartbeat changes
    contained = Owner("contained", me.host, _dead_pid(), me.started, me.boot, "pid:[1]")
    ended = Owner("ended", "another-host", 1, 0.0)  # its heartbeat is null: it ended
    ended_here = Owner("ended-here", me.host, me.pid, me.started, *here)  # a sweep of this process that ended
    owners = [live, dead, reused, far, far_stale, None, contained, ended, far, ended_here]
    beats = {live: [0], dead: [1], far: [3, 5, 6], far_stale: [4], contained: [6], ended: None}

    def beat(owner: Owner, count: int) -> None:
        value = None if beats[owner] is None else {"beat": count, "at": 0.0, "trials": beats[owner]}
        study.set_user_attr(f"saturn:{owner.heartbeat_key}", value)

    for owner in beats:
        beat(owner, 1)
    for i, owner in enumerate(owners):
        study.enqueue_trial({"x": i / 10})
        trial = study.ask()
        trial.suggest_float("x", 0, 1)
        trial.report(float(i), 1)
        if owner is not None:
            trial.set_user_attr("saturn:owner", owner.to_json())
    optuna.trial.Trial(study, study.trials[2]._trial_id).set_user_attr("saturn:retries", 1)  # retried once already
    clock = [1000.0]
    watch = HeartbeatWatch(clock=lambda: clock[0])  # (this sweep's own clock: beats' times are never read)

    assert recover_orphans(StudyGateway(study), me, max_retries=1, watch=watch) == [1, 7, 9]
    for clock[0] in _rounds(1000.0, STALE - 1):  # (a recovery every 30 s)
        beat(far, int(clock[0]))
        beat(contained, int(clock[0]))
        assert recover_orphans(StudyGateway(study), me, max_retries=1, watch=watch) == []  # not stale yet
    clock[0] = 1000.0 + STALE + 1
    retried = recover_orphans(StudyGateway(study), me, max_retries=1, watch=watch)

    states = [t.state for t in study.trials]
    assert states[:10] == [
        TrialState.RUNNING,
        TrialState.FAIL,
        TrialState.FAIL,
        TrialState.RUNNING,
        TrialState.FAIL,
        TrialState.RUNNING,
        TrialState.RUNNING,
        TrialState.FAIL,
        TrialState.FAIL,
        TrialState.FAIL,
    ]
    assert retried == [4, 8]  # trial 2 reached max_retries
    reasons = {t.number: t.system_attrs["saturn:fail_reason"] for t in study.trials if t.state == TrialState.FAIL}
    assert "is gone" in reasons[1] and "run again" in reasons[1]
    assert "max_retries" in reasons[2]
    assert f"is silent for {STALE + 1:.0f} s" in reasons[4], reasons[
        4
    ]  # on this sweep's clock, from when it first saw the beat
    assert "ended" in reasons[7]
    assert "ended" in reasons[9], reasons[9]  # (a null beat, in a process that lives on)
    assert f"far-sweep has not listed it among its trials for {STALE + 1:.0f} s" in reasons[8], reasons[
        8
    ]  # a live sweep's
    waiting = [t for t in study.trials if t.state == TrialState.WAITING]
    assert [(t.system_attrs["fixed_params"], t.user_attrs["saturn:retry_of"]) for t in waiting] == [
        ({"x": 0.1}, 1),
        ({"x": 0.7}, 7),
        ({"x": 0.9}, 9),
        ({"x": 0.4}, 4),
        ({"x": 0.8}, 8),
    ]


def test_a_trial_claimed_but_owned_by_no_one_is_recovered_once_no_claimant_lists_it(tmp_path):
    """A take cut short between its writes leaves a RUNNING trial with claims and no owner; a live sweep ends it
    and queues it again once none of its claimants' heartbeats listed it for the stale period."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.sqlite3'}")
    study.enqueue_trial({"x": 0.5})
    trial = study.ask()
    trial.suggest_float("x", 0, 1)
    trial.set_user_attr("saturn:claim:sweep-a", "nonce")
    study.set_user_attr("saturn:heartbeat:sweep-a", {"beat": 1, "at": 0.0, "trials": []})
    plain = study.ask()  # a plain study.optimize's trial: no owner, no claim
    me, clock = Owner.of_this_process(), [0.0]
    watch = HeartbeatWatch(clock=lambda: clock[0])
    for now in (0.0, *_rounds(0.0, STALE + 1)):
        clock[0] = now
        study.set_user_attr("saturn:heartbeat:sweep-a", {"beat": int(now), "at": now, "trials": []})  # alive
        retried = recover_orphans(StudyGateway(study), me, max_retries=1, watch=watch)
    assert retried == [0]
    trials = study.trials
    assert (
        trials[0].state == TrialState.FAIL
        and "which claimed it (no sweep owns it)" in trials[0].system_attrs["saturn:fail_reason"]
    )
    assert trials[plain.number].state == TrialState.RUNNING
    assert trials[-1].state == TrialState.WAITING and trials[-1].user_attrs["saturn:retry_of"] == 0


def test_two_sweeps_that_end_one_orphan_at_once_run_it_again_once(tmp_path):
    """The second sweep's view of the study is stale: the orphan it ends was ended a moment ago by the first. It
    neither fails (it did, at start-up) nor runs it again a second time."""
    storage = f"sqlite:///{tmp_path / 's.sqlite3'}"
    study = optuna.create_study(storage=storage)
    me = Owner.of_this_process()
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    dead = Owner("dead-sweep", me.host, _dead_pid(), me.started, me.boot, me.pid_namespace)
    trial.set_user_attr("saturn:owner", dead.to_json())
    stale = StudyGateway(optuna.load_study(study_name=study.study_name, storage=storage))
    seen = stale.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))

    assert recover_orphans(StudyGateway(study), me, max_retries=1) == [0]
    stale.study.get_trials = lambda *args, **kwargs: seen  # what it read before the first sweep ended it
    assert recover_orphans(stale, Owner.of_this_process(), max_retries=1) == []
    trials = optuna.load_study(study_name=study.study_name, storage=storage).trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.WAITING]


def test_max_retries_is_checked():
    with pytest.raises(ValueError, match="max_retries must be an integer >= 0"):
        SaturnExecutor(devices=1, strategies=["single"], max_retries=-1)


def _start_sweep(storage: str, log_dir) -> subprocess.Popen:
    """A sweep of 60 s trials on 2 devices, in its own process (``sweep_to_interrupt.py``), once its two first
    trials run and record their owner."""
    sweep = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "sweep_to_interrupt.py"), storage, str(log_dir)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])},
    )
    deadline = time.monotonic() + 90
    while True:
        assert sweep.poll() is None and time.monotonic() < deadline, "the first sweep's trials did not start"
        try:
            running = optuna.load_study(study_name="interrupted", storage=storage).get_trials(
                states=(TrialState.RUNNING,)
            )
        except KeyError:  # the study is not created yet
            running = []
        if len([t for t in running if "saturn:owner" in t.system_attrs and t.intermediate_values]) >= 2:
            return sweep
        time.sleep(0.2)


@pytest.mark.launch
def test_two_executors_share_a_study_and_leave_each_others_trials_alone(saturn_options, tmp_path, storage):
    first = _start_sweep(storage, tmp_path / "runs")
    try:
        study = optuna.load_study(study_name="interrupted", storage=storage)
        theirs = {t.number for t in study.get_trials(states=(TrialState.RUNNING,))}
        SaturnExecutor(devices=1, strategies=["single"], allow_shared_cores=True, **saturn_options).optimize(
            study, objectives.quadratic, n_trials=2
        )
        trials = {t.number: t for t in optuna.load_study(study_name="interrupted", storage=storage).trials}
        assert all(trials[n].state == TrialState.RUNNING for n in theirs)  # the live sweep's, untouched
        mine = [t for t in trials.values() if t.number not in theirs and "y" in t.params]
        assert len(mine) == 2 and all(t.state == TrialState.COMPLETE for t in mine)
        owners = {t.system_attrs["saturn:owner"]["sweep"] for t in trials.values() if "saturn:owner" in t.system_attrs}
        assert len(owners) == 2
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(timeout=60)
    ended = optuna.load_study(study_name="interrupted", storage=storage).trials
    assert not [t for t in ended if t.state == TrialState.RUNNING]


@pytest.mark.launch
def test_a_sweep_killed_with_sigkill_is_resumed_by_the_next(saturn_options, tmp_path, monkeypatch, storage):
    """kill -9 of the executor: its workers die with it, its two trials stay RUNNING; the next sweep on the
    study ends them FAIL with the reason, runs their params again first, then its own new trial."""
    sweep = _start_sweep(storage, tmp_path / "runs")
    descendants = psutil.Process(sweep.pid).children(recursive=True)
    sweep.send_signal(signal.SIGKILL)
    sweep.wait(timeout=30)
    _, alive = psutil.wait_procs(descendants, timeout=30)
    assert not alive, f"outlived their executor: {[p.pid for p in alive]}"  # the pool host and workers die with it

    study = optuna.load_study(study_name="interrupted", storage=storage)
    orphans = study.get_trials(states=(TrialState.RUNNING,))
    assert len(orphans) == 2
    monkeypatch.setenv("SATURN_TEST_SLEEPY_STEPS", "20")  # the same objective, shorter this time
    SaturnExecutor(devices=2, strategies=["single"], **saturn_options).optimize(study, objectives.sleepy, n_trials=1)

    trials = optuna.load_study(study_name="interrupted", storage=storage).trials
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    by_number = {t.number: t for t in trials}
    for orphan in orphans:
        ended = by_number[orphan.number]
        assert (
            ended.state == TrialState.FAIL and "the sweep that ran it died" in ended.system_attrs["saturn:fail_reason"]
        )
    retries = [t for t in trials if "saturn:retry_of" in t.user_attrs]
    assert sorted(t.user_attrs["saturn:retry_of"] for t in retries) == sorted(o.number for o in orphans)
    assert all(t.state == TrialState.COMPLETE for t in retries)
    for retry in retries:
        orphan = by_number[retry.user_attrs["saturn:retry_of"]]
        assert retry.params == orphan.params
        assert orphan.intermediate_values and set(orphan.intermediate_values) <= set(retry.intermediate_values)
    new = [t for t in trials if t.number > max(o.number for o in orphans) and "saturn:retry_of" not in t.user_attrs]
    assert len(new) == 1 and new[0].state == TrialState.COMPLETE  # n_trials counts new trials


@pytest.mark.launch
def test_a_trial_run_again_starts_ahead_of_the_new_trials_asked_after_it(saturn_options, tmp_path, monkeypatch):
    """The params of a trial whose rank died go back to the study's queue. The next trial the sweep takes is that
    retry, not a new one, even when the queue was read (empty) a moment before; and n_trials still counts new
    trials, so no retry is left WAITING when the sweep ends. (Before, a new trial was asked ahead of it, and on a
    Ray cluster that lost a node the retry was left WAITING.)"""
    storage = f"sqlite:///{tmp_path / 'study.sqlite3'}"
    study = optuna.create_study(study_name="rank-dies", storage=storage)
    # 3 s trials, trial 0 killed about 1 s in: no look-ahead trial is asked yet (it would start ahead of the retry,
    # having been asked before it)
    monkeypatch.setenv("SATURN_TEST_SLEEPY_STEPS", "30")
    killer = kill_a_worker_once(storage, "rank-dies", "saturn-worker-0", lambda t: bool(t.intermediate_values))
    SaturnExecutor(devices=1, strategies=["single"], **saturn_options).optimize(study, objectives.sleepy, n_trials=3)
    killer.join(timeout=5)

    trials = optuna.load_study(study_name="rank-dies", storage=storage).trials
    assert trials[0].state == TrialState.FAIL, trials[0].user_attrs
    retry = next(t for t in trials if t.user_attrs.get("saturn:retry_of") == 0)
    assert retry.state == TrialState.COMPLETE and retry.params == trials[0].params
    later = [t for t in trials if t.number > retry.number]
    assert later and all(t.datetime_start > retry.datetime_start for t in later), [
        (t.number, t.datetime_start) for t in trials
    ]
    assert [t.state for t in trials].count(TrialState.COMPLETE) == 3  # n_trials new trials, and the retry
    assert not [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]


@pytest.mark.launch
def test_a_running_sweep_recovers_the_trials_of_a_sweep_that_died_meanwhile(saturn_options, tmp_path, monkeypatch):
    """Two sweeps on one study; the first dies (kill -9) after the second started, when the second's start-up
    recovery had found it alive. The second, still running, ends the dead one's trials FAIL and runs them again
    itself (before, only a sweep started after the death did)."""
    from optuna_saturn.study import ownership

    storage = f"sqlite:///{tmp_path / 'study.sqlite3'}"
    first = _start_sweep(storage, tmp_path / "first")
    study = optuna.load_study(study_name="interrupted", storage=storage)
    orphans = [t.number for t in study.get_trials(states=(TrialState.RUNNING,))]
    monkeypatch.setattr(ownership, "RECOVER_SECONDS", 1.0)
    monkeypatch.setenv("SATURN_TEST_SLEEPY_STEPS", "40")  # the second sweep's trials: 4 s

    def kill_the_first_once_the_second_runs() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            mine = [t for t in study.get_trials(states=(TrialState.RUNNING,)) if t.number not in orphans]
            if mine and mine[0].intermediate_values:
                first.send_signal(signal.SIGKILL)
                return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_the_first_once_the_second_runs, daemon=True)
    killer.start()
    try:
        SaturnExecutor(devices=1, strategies=["single"], allow_shared_cores=True, **saturn_options).optimize(
            study, objectives.sleepy, n_trials=1
        )
    finally:
        killer.join(timeout=5)
        first.kill()
        first.wait(timeout=30)
    trials = {t.number: t for t in optuna.load_study(study_name="interrupted", storage=storage).trials}
    assert all(trials[n].state == TrialState.FAIL for n in orphans)
    assert all("the sweep that ran it died" in trials[n].system_attrs["saturn:fail_reason"] for n in orphans)
    retries = [t for t in trials.values() if t.user_attrs.get("saturn:retry_of") in orphans]
    assert len(retries) == len(orphans) and all(t.state == TrialState.COMPLETE for t in retries)
    assert not [t for t in trials.values() if t.state in (TrialState.RUNNING, TrialState.WAITING)]


def test_a_result_that_comes_after_another_sweep_ended_its_trial_is_kept_not_thrown_away(tmp_path, caplog):
    """A sweep was taken for dead and its trial ended FAIL (and queued again) by another; the trial then finished
    in the live sweep. Its result is kept (in the study and in the outbox), the error names both sweeps, and the
    live sweep queues no second retry."""
    from optuna_saturn.study.outbox import Outbox

    storage = f"sqlite:///{tmp_path / 's.sqlite3'}"
    study = optuna.create_study(storage=storage)
    live = Owner.of_this_process()
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    trial.set_user_attr("saturn:owner", {**live.to_json(), "boot": "another boot"})  # (its pid looks dead)
    other = Owner.of_this_process()
    assert recover_orphans(
        StudyGateway(optuna.load_study(study_name=study.study_name, storage=storage)), other, max_retries=1
    ) == [0]

    outbox = Outbox(tmp_path / "outbox")
    with caplog.at_level("ERROR", logger="optuna.saturn"):
        frozen = StudyGateway(study, outbox=outbox).tell(trial, TrialState.COMPLETE, [0.5], attrs={"strategy": "ddp"})
    assert frozen.state == TrialState.FAIL  # the storage's word stands
    assert study.user_attrs["saturn:late_result:0"] == {"state": "COMPLETE", "values": [0.5], "sweep": live.sweep}
    assert list(outbox.late_folder.glob("*.json")) and not list(outbox.folder.glob("*.json"))  # set aside
    assert other.sweep in caplog.text and live.sweep in caplog.text
    assert [t.state for t in optuna.load_study(study_name=study.study_name, storage=storage).trials] == [
        TrialState.FAIL,
        TrialState.WAITING,
    ]  # one retry: the other sweep's


def _running_trial_of(study: optuna.Study, owner: Owner | None, *, claimed_by: list[str] = ()) -> None:
    study.enqueue_trial({"x": 0.5})
    trial = study.ask()
    trial.suggest_float("x", 0, 1)
    if owner is not None:
        trial.set_user_attr("saturn:owner", owner.to_json())
    for sweep in claimed_by:
        trial.set_user_attr(f"saturn:claim:{sweep}", "nonce")


def test_a_sweep_that_ended_in_a_process_that_lives_on_leaves_no_trial_running_for_ever(tmp_path):
    """A notebook's sweep that stopped (its beat null) in a kernel that lives on: its pid alone kept its trial
    RUNNING for ever (reliability review, finding 8a)."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.sqlite3'}")
    me = Owner.of_this_process()
    parent = psutil.Process(os.getppid())
    kernel = Owner("notebook-sweep", me.host, parent.pid, parent.create_time(), me.boot, me.pid_namespace)
    study.set_user_attr(f"saturn:{kernel.heartbeat_key}", None)
    _running_trial_of(study, kernel)
    assert recover_orphans(StudyGateway(study), me, max_retries=1, watch=HeartbeatWatch()) == [0]
    assert "its sweep ended" in study.trials[0].system_attrs["saturn:fail_reason"]


def test_a_trial_claimed_by_sweeps_that_all_ended_is_recovered_after_the_stale_period(tmp_path):
    """Two claims and a lost reply: no sweep owns the trial; once both claimants ended (null beats) it was taken
    as listed by them for ever (finding 8b)."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.sqlite3'}")
    for sweep in ("a", "b"):
        study.set_user_attr(f"saturn:heartbeat:{sweep}", None)
    _running_trial_of(study, None, claimed_by=["a", "b"])
    me, clock = Owner.of_this_process(), [0.0]
    watch = HeartbeatWatch(clock=lambda: clock[0])
    assert recover_orphans(StudyGateway(study), me, max_retries=1, watch=watch) == []
    for clock[0] in _rounds(0.0, STALE - 1):
        assert recover_orphans(StudyGateway(study), me, max_retries=1, watch=watch) == []
    clock[0] = STALE + 1
    assert recover_orphans(StudyGateway(study), me, max_retries=1, watch=watch) == [0]


def test_a_clock_step_or_a_hidden_proc_does_not_judge_a_live_sweep_gone(monkeypatch):
    """The same host: a process's start time moves with the wall clock (an NTP step), and /proc mounted hidepid
    hides other users' processes (psutil raised AccessDenied out of the recovery): finding 11."""
    me = Owner.of_this_process()
    parent = psutil.Process(os.getppid())
    stepped = Owner("live", me.host, parent.pid, parent.create_time() + 1.0, me.boot, me.pid_namespace)
    beat = {"beat": 1, "at": 0.0, "trials": [0]}
    assert stepped.gone(beat, HeartbeatWatch(), judge=me) is None

    def hidden(pid):
        raise psutil.AccessDenied(pid)

    monkeypatch.setattr(psutil, "Process", hidden)
    clock = [0.0]
    watch = HeartbeatWatch(clock=lambda: clock[0])
    assert stepped.gone(beat, watch, judge=me) is None  # the heartbeat decides: first seen now
    clock[0] += STALE + 1
    assert f"silent for {STALE + 1:.0f} s" in stepped.gone(beat, watch, judge=me)


def test_a_judge_that_stalled_does_not_count_its_own_stall_as_the_others_silence(tmp_path):
    """The judging sweep's own process stopped for five minutes (Ctrl-Z, a laptop asleep, an outage that held
    every sweep): at its first round after, a live sweep whose beat it last saw before the stall is not judged
    dead before it could beat again (finding 14)."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.sqlite3'}")
    far = Owner("far-sweep", "another-host", 1, 0.0)
    study.set_user_attr(f"saturn:{far.heartbeat_key}", {"beat": 1, "at": 0.0, "trials": [0]})
    _running_trial_of(study, far)
    me, clock = Owner.of_this_process(), [0.0]
    watch = HeartbeatWatch(clock=lambda: clock[0])
    assert recover_orphans(StudyGateway(study), me, max_retries=1, watch=watch) == []
    clock[0] = 300.0  # (the judge was stopped)
    assert recover_orphans(StudyGateway(study), me, max_retries=1, watch=watch) == []
    for clock[0] in _rounds(300.0, STALE + 1):  # but silence it watches is counted
        retried = recover_orphans(StudyGateway(study), me, max_retries=1, watch=watch)
    assert retried == [0]


def test_a_retry_the_storage_failed_to_queue_is_queued_at_the_next_round(tmp_path, monkeypatch):
    """The orphan ended FAIL, then the storage failed before its retry was queued: no sweep recovers a FAIL
    trial, so that retry was lost for good (finding 18). It stays due, and the next round queues it."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.sqlite3'}")
    study.set_user_attr("saturn:heartbeat:ended", None)
    _running_trial_of(study, Owner("ended", "another-host", 1, 0.0))
    enqueue, failures = study.add_trial, [sqlalchemy.exc.OperationalError("INSERT", {}, Exception("down"))]

    def fail_once(*args, **kwargs):
        if failures:
            raise failures.pop()
        return enqueue(*args, **kwargs)

    monkeypatch.setattr(study, "add_trial", fail_once)  # (how a retry is queued: study.enqueue_trial, with records)
    watch, me = HeartbeatWatch(), Owner.of_this_process()
    with pytest.raises(sqlalchemy.exc.OperationalError):
        recover_orphans(StudyGateway(study), me, max_retries=1, watch=watch)
    assert [t.state for t in study.trials] == [TrialState.FAIL]
    assert recover_orphans(StudyGateway(study), me, max_retries=1, watch=watch) == [0]
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.WAITING]


def _end_as_another_sweep(storage: str, study_name: str, number: int) -> None:
    """What a sweep that took the trial's sweep for dead does: its reason and name, then the move to FAIL."""
    other = optuna.load_study(study_name=study_name, storage=storage)
    trial = other.trials[number]
    from optuna_saturn.study.ownership import _end_orphan

    assert _end_orphan(StudyGateway(other), trial, "silent", again=False, by=Owner("other", "h", 1, 0.0))


def test_a_run_whose_trial_another_sweep_ended_is_told_to_prune_and_its_writes_are_dropped(tmp_path):
    """A paused sweep's trial was taken over: its run's next report or checkpoint raised in the executor, and the
    objective failed (finding 6). The run is now told to prune itself, and its writes are dropped."""
    from optuna_saturn.clock import WallClock
    from optuna_saturn.study.trial_session import TrialSession

    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(storage=storage)
    gateway = StudyGateway(study, owner={"sweep": "paused"})
    trial = gateway.ask_new()
    session = TrialSession(trial, gateway.lock, WallClock())
    session.handle("report", {"value": 1.0, "step": 1})
    assert session.handle("should_prune", {}) is False
    _end_as_another_sweep(storage, study.study_name, trial.number)
    assert session.handle("report", {"value": 0.5, "step": 2}) is None
    assert session.taken_over and session.handle("should_prune", {}) is True
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):  # (so the worker prunes nothing)
        session.handle("checkpointed", {"record": {"step": 2, "path": "/x"}})
    stored = optuna.load_study(study_name=study.study_name, storage=storage).trials[0]
    assert stored.state == TrialState.FAIL and stored.intermediate_values == {1: 1.0}


def test_the_heartbeat_notes_held_trials_another_sweep_ended_and_lists_them_no_more(tmp_path, monkeypatch):
    from optuna_saturn.study import liveness as beats

    monkeypatch.setattr(beats, "HEARTBEAT_SECONDS", 3600.0)  # (the beat written on entering is the one looked at)
    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(storage=storage)
    gateway = StudyGateway(study, owner={"sweep": "paused"})
    kept, taken = gateway.ask_new(), gateway.ask_new()
    _end_as_another_sweep(storage, study.study_name, taken.number)
    with beats.Heartbeat(gateway, "paused"):
        assert gateway.taken_over() == {taken.number}
        assert set(gateway.held_trials()) == {kept.number}


@pytest.mark.launch
def test_a_sweep_stops_the_run_of_a_trial_another_sweep_ended_and_keeps_no_late_result(
    saturn_options, tmp_path, monkeypatch
):
    """The run of a trial that another sweep ended (taking this one for dead) is stopped at the next beat, not
    left to run its whole minute; its device frees, and its end adds no retry and no late result."""
    from optuna_saturn.study import liveness as beats

    monkeypatch.setattr(beats, "HEARTBEAT_SECONDS", 0.5)
    storage = f"sqlite:///{tmp_path / 'study.sqlite3'}"
    study = optuna.create_study(storage=storage, study_name="taken")

    def end_it_once_it_reports() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            running = study.get_trials(states=(TrialState.RUNNING,))
            if running and running[0].intermediate_values:
                _end_as_another_sweep(storage, "taken", running[0].number)
                return
            time.sleep(0.1)

    ender = threading.Thread(target=end_it_once_it_reports, daemon=True)
    ender.start()
    started = time.monotonic()
    SaturnExecutor(devices=1, strategies=["single"], allow_shared_cores=True, **saturn_options).optimize(
        study, objectives.sleepy, n_trials=1
    )
    ender.join(timeout=5)
    assert time.monotonic() - started < 50  # (its run alone takes 60 s)
    (trial,) = optuna.load_study(study_name="taken", storage=storage).trials
    assert trial.state == TrialState.FAIL and trial.system_attrs["saturn:ended_by"] == "other"
    assert not [key for key in study.user_attrs if key.startswith("saturn:late_result")]
