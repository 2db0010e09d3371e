"""A storage that fails while the sweep tells a result loses nothing: telling is retried with back-off, and the
result waits on disk (the outbox) until the storage has it; what a dead sweep left there is told by the next."""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time

import objectives
import optuna
import pytest
import sqlalchemy.exc
from optuna.trial import TrialState

from optuna_saturn import SaturnExecutor
from optuna_saturn.study import gateway as gateway_module
from optuna_saturn.study import moves
from optuna_saturn.study.folders import study_folder
from optuna_saturn.study.gateway import StudyGateway
from optuna_saturn.study.liveness import STALE_AFTER_SECONDS
from optuna_saturn.study.outbox import Outbox, Outgoing
from optuna_saturn.study.ownership import Owner


def _locked_for(path: str, seconds: float, locked: threading.Event) -> None:
    """Another process's write lock on the SQLite file, as a sweep's storage meets it."""
    connection = sqlite3.connect(path, timeout=0)
    connection.execute("BEGIN EXCLUSIVE")
    locked.set()
    time.sleep(seconds)
    connection.rollback()
    connection.close()


def test_a_result_is_told_once_the_locked_sqlite_file_is_free_and_kept_on_disk_until_then(tmp_path, caplog):
    path = tmp_path / "study.sqlite3"
    storage = optuna.storages.RDBStorage(f"sqlite:///{path}", engine_kwargs={"connect_args": {"timeout": 0.2}})
    study = optuna.create_study(storage=storage, study_name="locked")
    outbox = Outbox(tmp_path / "outbox")
    bridge = StudyGateway(study, outbox=outbox)
    trial = bridge.ask_new()
    locked = threading.Event()
    holder = threading.Thread(target=_locked_for, args=(str(path), 2.0, locked))
    holder.start()
    locked.wait(timeout=10)
    seen_on_disk = []

    def watch() -> None:
        deadline = time.monotonic() + 1.5  # (the lock holds for 2 s)
        while not seen_on_disk and time.monotonic() < deadline:
            seen_on_disk.extend(result for _, result in outbox.pending())
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    with caplog.at_level(logging.WARNING, logger="optuna.saturn"):
        watcher.start()  # while the lock holds, the result is on disk
        frozen = bridge.tell(trial, TrialState.COMPLETE, [1.5], attrs={"strategy": "single"})
    holder.join()
    watcher.join()
    assert frozen.state == TrialState.COMPLETE and frozen.value == 1.5
    stored = optuna.load_study(study_name="locked", storage=f"sqlite:///{path}").trials[0]
    assert stored.state == TrialState.COMPLETE and stored.system_attrs["saturn:strategy"] == "single"
    assert "trying again" in caplog.text and "database is locked" in caplog.text
    assert [r.values for r in seen_on_disk] == [[1.5]]  # kept until the storage had it, then removed
    assert not outbox.pending()


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.launch
def test_a_result_a_dead_sweep_kept_on_disk_is_told_by_the_next_sweep(saturn_options, tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.sqlite3'}"
    study = optuna.create_study(study_name="kept", storage=storage)
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    dead = Owner("deadsweep", socket.gethostname(), _dead_pid(), 0.0)
    study._storage.set_trial_user_attr(trial._trial_id, "saturn:owner", dead.to_json())
    # The dead sweep had the result, but the storage never got it.
    outbox = saturn_options["log_dir"] / "outbox" / study_folder(study)  # (the study's own, not its name's)
    Outbox(outbox).keep(Outgoing(trial._trial_id, trial.number, "COMPLETE", [0.25], {"saturn:strategy": "ddp"}))

    SaturnExecutor(devices=1, strategies=["single"], **saturn_options).optimize(study, objectives.quadratic, n_trials=0)
    trials = optuna.load_study(study_name="kept", storage=storage).trials
    assert len(trials) == 1  # told, not ended FAIL and run again
    assert trials[0].state == TrialState.COMPLETE and trials[0].value == 0.25
    assert trials[0].system_attrs["saturn:strategy"] == "ddp"
    assert not list(outbox.glob("*.json"))


def test_an_ask_whose_reply_is_lost_creates_one_trial_and_it_is_owned(tmp_path):
    """The storage commits the new trial, then the reply is lost (an error after the write): the retry finds the
    trial by its claim instead of creating a second one, and the trial was created owned, in the same write."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.sqlite3'}")
    real = study._storage.create_new_trial
    failures = [sqlalchemy.exc.OperationalError("INSERT", {}, Exception("the connection dropped"))]

    def commit_then_fail(*args, **kwargs):
        trial_id = real(*args, **kwargs)
        if failures:
            raise failures.pop()
        return trial_id

    study._storage.create_new_trial = commit_then_fail
    owner = Owner.of_this_process()
    trial = StudyGateway(study, owner=owner.to_json()).ask_new()
    trials = study.get_trials()
    assert len(trials) == 1 and trials[0]._trial_id == trial._trial_id
    assert trials[0].state == TrialState.RUNNING and trials[0].system_attrs["saturn:owner"] == owner.to_json()


# every write a take makes, in order: the claim, the move to RUNNING, the owner, the params, the attributes
_TAKE_WRITES = [
    ("set_trial_system_attr", 1),  # the claim
    ("move", 1),  # (one conditional write: optuna_saturn.study.moves)
    ("write_records", 1),  # the owner and the records, in one transaction (optuna_saturn.study.attr_writes)
    ("set_trial_param", 1),
    ("set_trial_param", 2),
]


def _lose_replies(monkeypatch, storage, method: str, *, nth: int, before=None) -> list[str]:
    """Make ``storage``'s ``nth`` call of ``method`` commit, then raise (its reply lost); ``before`` runs first
    (another process's write, landing just before this one). Returns the log of calls. The move to RUNNING is
    :func:`optuna_saturn.study.moves.move`'s, not a storage method; so is the write of a trial's records."""
    if method == "move":
        storage = moves
    if method == "write_records":
        storage = gateway_module
    real, calls = getattr(storage, method), []

    def commit_then_fail(*args, **kwargs):
        calls.append(method)
        if len(calls) == nth and before is not None:
            before()
        result = real(*args, **kwargs)
        if len(calls) == nth:
            raise sqlalchemy.exc.OperationalError("UPDATE", {}, Exception("the connection dropped"))
        return result

    monkeypatch.setattr(storage, method, commit_then_fail)
    return calls


@pytest.mark.parametrize("write", _TAKE_WRITES, ids=lambda w: f"{w[0]}-{w[1]}")
def test_a_take_whose_reply_is_lost_at_any_write_takes_the_trial_once_and_owns_it(tmp_path, monkeypatch, write):
    """Every write of a take (the claim, the move to RUNNING, the owner, the params), its reply lost after it
    committed: the take reads the trial back and goes on. One trial, RUNNING, owned by this sweep, with its
    params and attributes; nothing created twice, nothing left unowned."""
    method, nth = write
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.sqlite3'}")
    study.enqueue_trial({"x": 0.25, "y": 2})
    queued = study.get_trials()[0]
    calls = _lose_replies(monkeypatch, study._storage, method, nth=nth)
    owner = Owner.of_this_process()
    distributions = {"x": optuna.distributions.FloatDistribution(0, 1), "y": optuna.distributions.IntDistribution(0, 4)}
    trial = StudyGateway(study, owner=owner.to_json()).take(queued._trial_id, distributions, {"saturn:tag": "t"})
    assert len(calls) >= nth, f"the take made fewer than {nth} {method} calls: {calls}"
    trials = study.get_trials()
    assert trial is not None and len(trials) == 1 and trials[0]._trial_id == trial._trial_id
    assert trials[0].state == TrialState.RUNNING and trials[0].params == {"x": 0.25, "y": 2}
    assert trials[0].system_attrs["saturn:owner"] == owner.to_json() and trials[0].system_attrs["saturn:tag"] == "t"


def test_two_sweeps_that_claim_one_trial_while_a_reply_is_lost_never_both_run_it_and_it_is_not_left_running(
    tmp_path, caplog, monkeypatch
):
    """Sweep A's move to RUNNING commits but its reply is lost, just after sweep B claimed the trial too. A
    cannot tell whose move it was, so it steps back, and B finds it taken: neither runs it. No sweep's heartbeat
    lists it, so a live sweep's recovery ends it and queues it again, once."""
    from optuna_saturn.study.liveness import HeartbeatWatch
    from optuna_saturn.study.ownership import recover_orphans

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.sqlite3'}")
    study.enqueue_trial({"x": 0.5})
    queued = study.get_trials()[0]
    a, b = Owner("sweep-a", "h", 1, 0.0), Owner("sweep-b", "h", 2, 0.0)
    study.set_user_attr(f"saturn:{a.heartbeat_key}", {"beat": 1, "at": 0.0, "trials": []})
    study.set_user_attr(f"saturn:{b.heartbeat_key}", {"beat": 1, "at": 0.0, "trials": []})

    def b_claims() -> None:
        study._storage.set_trial_user_attr(queued._trial_id, "saturn:claim:sweep-b", "b's nonce")

    _lose_replies(monkeypatch, study._storage, "move", nth=1, before=b_claims)
    with caplog.at_level(logging.WARNING, logger="optuna.saturn"):
        assert StudyGateway(study, owner=a.to_json()).take(queued._trial_id, {}, {}) is None
    assert "unclear whether this sweep (sweep-a)" in caplog.text
    other = optuna.load_study(study_name=study.study_name, storage=f"sqlite:///{tmp_path / 'study.sqlite3'}")
    assert StudyGateway(other, owner=b.to_json()).take(queued._trial_id, {}, {}) is None

    clock = [0.0]
    watch = HeartbeatWatch(clock=lambda: clock[0])
    retried = []
    for clock[0] in (0.0, *range(30, int(STALE_AFTER_SECONDS), 30), STALE_AFTER_SECONDS + 1):
        retried += recover_orphans(StudyGateway(other), Owner.of_this_process(), max_retries=1, watch=watch)
    states = [t.state for t in other.get_trials()]
    assert retried == [0] and states == [TrialState.FAIL, TrialState.WAITING]


def test_two_sweeps_racing_for_each_queued_trial_take_each_one_once(storage):
    """The README's promise: sweeps on one study never both run a queued trial. Two sweeps (two storages on one
    database, as two processes would have) race for each of 20 queued trials at once. (On SQLite, which ignores
    SELECT ... FOR UPDATE, both took one before the take's lock.)"""
    url = storage
    study = optuna.create_study(storage=url, study_name="race")
    for i in range(20):
        study.enqueue_trial({"x": i / 20})
    queued = [t._trial_id for t in study.get_trials()]
    sweeps = [Owner(f"sweep-{i}", "h", i, 0.0) for i in range(2)]
    gateways = [
        StudyGateway(optuna.load_study(study_name="race", storage=optuna.storages.RDBStorage(url)), owner=s.to_json())
        for s in sweeps
    ]
    taken: dict[int, list[str]] = {trial_id: [] for trial_id in queued}
    start = threading.Barrier(2)

    def race(gateway: StudyGateway, sweep: Owner) -> None:
        start.wait()
        for trial_id in queued:
            if gateway.take(trial_id, {}, {}) is not None:
                taken[trial_id].append(sweep.sweep)

    threads = [threading.Thread(target=race, args=pair) for pair in zip(gateways, sweeps)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(len(winners) == 1 for winners in taken.values()), taken
    trials = optuna.load_study(study_name="race", storage=url).get_trials()
    assert all(t.state == TrialState.RUNNING for t in trials)
    assert [t.system_attrs["saturn:owner"]["sweep"] for t in trials] == [taken[t._trial_id][0] for t in trials]
    assert {s: len(g.held_trials()) for s, g in zip(("sweep-0", "sweep-1"), gateways)} == {
        s: sum(w == [s] for w in taken.values()) for s in ("sweep-0", "sweep-1")
    }


@pytest.mark.launch
def test_a_storage_outage_during_recovery_ends_the_round_not_the_sweep(saturn_options, tmp_path, monkeypatch, caplog):
    """Recovery runs every 30 s (here 0.3 s) and reads the whole study: an outage then (here every round after the
    first fails) used to leave the loop and stop every running trial (reliability review, finding 1)."""
    from optuna_saturn.study import ownership

    real, rounds = ownership.take_over, []

    def flaky(*args, **kwargs):
        rounds.append(time.monotonic())
        if len(rounds) > 1:
            raise sqlalchemy.exc.OperationalError("SELECT", {}, sqlite3.OperationalError("database is locked"))
        return real(*args, **kwargs)

    monkeypatch.setattr(ownership, "take_over", flaky)
    monkeypatch.setattr(ownership, "RECOVER_SECONDS", 0.3)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.sqlite3'}")
    for offset in (1.0, 2.0, 3.0):
        study.enqueue_trial({"offset": offset})
    with caplog.at_level(logging.WARNING, logger="optuna.saturn"):
        SaturnExecutor(devices=1, strategies=["single"], **saturn_options).optimize(study, objectives.curve, n_trials=3)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    assert len(rounds) >= 3  # the failed rounds came, and the sweep went on through them
    assert "Recovery could not reach the storage (OperationalError" in caplog.text


def test_a_result_told_while_another_sweep_ends_the_trial_is_kept_as_late_not_raised(tmp_path, monkeypatch):
    """Another sweep's recovery ends the trial (taken for an orphan) in the middle of this sweep's tell, between
    its check and its writes: the tell used to raise (UpdateFinishedTrialError) and stop this sweep; the result is
    now kept as the trial's late result, in the study and the outbox (reliability review, finding 5)."""
    from optuna_saturn.study.ownership import _end_orphan

    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(storage=url)
    mine = StudyGateway(study, outbox=Outbox(tmp_path / "outbox"), owner=Owner.of_this_process().to_json())
    trial = mine.ask_new()
    trial.suggest_float("x", 0, 1)
    other = StudyGateway(optuna.load_study(study_name=study.study_name, storage=url))
    real = moves.tell_if_running

    def interleaved(*args, **kwargs):
        # the other sweep's recovery lands between this tell's check of the trial and its writes
        _end_orphan(other, other.study.get_trials()[0], "silent for 61 s", again=True, by=Owner("b", "h", 1, 0.0))
        return real(*args, **kwargs)

    monkeypatch.setattr(moves, "tell_if_running", interleaved)
    frozen = mine.tell(trial, TrialState.COMPLETE, [0.5], attrs={f"k{i}": i for i in range(10)})
    assert frozen.state == TrialState.FAIL  # as the other sweep ended it
    late = optuna.load_study(study_name=study.study_name, storage=url).user_attrs["saturn:late_result:0"]
    assert late["state"] == "COMPLETE" and late["values"] == [0.5]


def test_the_outbox_is_private_and_ignores_files_it_did_not_write(tmp_path):
    """Its files are taken as results at the next start: under umask 002 anyone in the group could have put one
    there (reliability review, finding 20)."""
    before = os.umask(0o002)
    try:
        outbox = Outbox(tmp_path / "outbox" / "study-1")
        kept = outbox.keep(Outgoing(1, 0, "COMPLETE", [0.5], {}))
    finally:
        os.umask(before)
    assert oct((tmp_path / "outbox").stat().st_mode & 0o777) == "0o700" and oct(kept.stat().st_mode & 0o777) == "0o600"
    planted = tmp_path / "outbox" / "study-1" / "trial-9-deadbeef.json"
    planted.write_text(kept.read_text())
    os.chown(planted, 12345, 12345)
    assert [path for path, _ in outbox.pending()] == [kept]
