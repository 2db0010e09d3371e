"""On a SQLite file, each move of a trial is made by one sweep only, with no lock file: two sweeps that end one
orphan at once queue one retry, two users of one file both take trials, and a storage that is not safe to share
is refused before anything runs (reliability review, findings 7, 10 and 12)."""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import tempfile
import threading

import optuna
import pytest
from optuna.trial import TrialState

from optuna_saturn.study import ownership
from optuna_saturn.study.gateway import StudyGateway
from optuna_saturn.study.ownership import Owner, recover_orphans
from optuna_saturn.study.storage_checks import file_system_of, refuse_lost_guarantees


def test_two_sweeps_that_end_one_orphan_at_the_same_moment_queue_it_once(tmp_path, monkeypatch):
    """Both sweeps read the orphan RUNNING before either ends it (a barrier between the read and the writes):
    SQLite's reads are outside the write's transaction, so both ended it and both queued a retry (finding 7)."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(storage=url)
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    trial.set_user_attr("saturn:owner", Owner("dead", "another-host", 1, 0.0).to_json())  # no heartbeat: gone
    both_read = threading.Barrier(2, timeout=20)
    decide = ownership.why_orphaned

    def after_both_read(*args, **kwargs):
        reason = decide(*args, **kwargs)
        both_read.wait()
        return reason

    monkeypatch.setattr(ownership, "why_orphaned", after_both_read)
    queued: dict[str, list[int]] = {}

    def sweep(name: str) -> None:
        other = optuna.load_study(study_name=study.study_name, storage=optuna.storages.RDBStorage(url))
        queued[name] = recover_orphans(StudyGateway(other), Owner(name, "h2", 2, 0.0), max_retries=1)

    threads = [threading.Thread(target=sweep, args=(f"sweep-{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(len(numbers) for numbers in queued.values()) == [0, 1], queued
    trials = optuna.load_study(study_name=study.study_name, storage=url).trials
    winner = next(name for name, numbers in queued.items() if numbers)
    assert trials[0].system_attrs["saturn:ended_by"] == winner  # (the loser wrote nothing)
    assert [(t.state, t.user_attrs.get("saturn:retry_of")) for t in trials] == [
        (TrialState.FAIL, None),
        (TrialState.WAITING, 0),
    ]


@pytest.fixture
def shared_folder():
    """A folder every user can reach (pytest's own tmp_path lies under a private one)."""
    folder = tempfile.mkdtemp(prefix="saturn-shared-")
    os.chmod(folder, 0o777)
    yield pathlib.Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


def test_two_users_of_one_sqlite_file_both_take_trials_and_no_lock_file_is_made(shared_folder):
    """The take's lock file was created 0600 by the first user: the second's takes failed with EACCES, retried
    as a storage error for two minutes, then the sweep stopped (finding 10). Now a take is one conditional write
    that SQLite itself makes once."""
    db = shared_folder / "shared.sqlite3"
    study = optuna.create_study(storage=f"sqlite:///{db}", study_name="shared")
    for x in (0.1, 0.2):
        study.enqueue_trial({"x": x})
    os.chmod(db, 0o666)
    ids = [t._trial_id for t in study.trials]
    for uid, trial_id in zip((1001, 1002), ids):
        pid = os.fork()
        if pid == 0:  # (a user of its own)
            code = 1
            try:
                os.setgid(uid)
                os.setuid(uid)
                mine = optuna.load_study(study_name="shared", storage=f"sqlite:///{db}")
                code = 0 if StudyGateway(mine, owner={"sweep": f"user-{uid}"}).take(trial_id, {}, {}) else 2
            except BaseException as exc:
                print(f"uid {uid}: {exc!r}", file=sys.stderr, flush=True)
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, f"uid {uid} could not take its trial"
    assert [t.state for t in optuna.load_study(study_name="shared", storage=f"sqlite:///{db}").trials] == [
        TrialState.RUNNING,
        TrialState.RUNNING,
    ]
    assert not list(shared_folder.glob("*.lock"))


def test_sqlite_on_a_network_file_system_and_in_memory_are_refused(tmp_path, monkeypatch):
    """SQLite's locks are unsafe over NFS and Lustre: two hosts could take one trial (finding 10c). The error
    says where the file is and what to use instead."""
    from optuna_saturn.study import storage_checks

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 's.db'}")
    refuse_lost_guarantees(storage)  # a local disk
    assert file_system_of(tmp_path / "s.db") not in storage_checks.NETWORK_FILE_SYSTEMS
    monkeypatch.setattr(storage_checks, "file_system_of", lambda path: "nfs4")
    with pytest.raises(ValueError, match=r"network file system \(nfs4\).*postgresql://"):
        refuse_lost_guarantees(storage)
    with pytest.raises(ValueError, match="in-memory SQLite"):
        refuse_lost_guarantees(optuna.storages.RDBStorage("sqlite:///:memory:"))


def test_the_file_system_of_a_path_is_read_from_the_mount_table():
    assert file_system_of(pathlib.Path("/proc/self/status")) == "proc"


def test_a_sweep_that_loses_the_end_of_an_orphan_leaves_no_reason_on_it(tmp_path):
    """The owner told its result between another sweep's look and its end: the trial is COMPLETE, and carries no
    fail_reason or ended_by of the sweep that took it for an orphan (reliability review, finding 7)."""
    from optuna_saturn.study.ownership import _end_orphan

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    stale = study.trials[0]  # (what the other sweep read: RUNNING)
    study.tell(trial, 0.5)
    assert not _end_orphan(StudyGateway(study), stale, "silent", again=True, by=Owner("b", "h", 1, 0.0))
    (stored,) = study.trials
    assert stored.state == TrialState.COMPLETE and not [
        k for k in {**stored.user_attrs, **stored.system_attrs} if k.startswith("saturn:")
    ]


class _WaitsInAfterTrial(optuna.samplers.RandomSampler):
    """A sampler whose ``after_trial`` (which ``study.tell`` calls after it read the trial RUNNING, before it
    writes the end) lets another sweep end the trial first: the forced order of the race."""

    def __init__(self, meanwhile) -> None:
        super().__init__(seed=0)
        self._meanwhile = meanwhile

    def after_trial(self, study, trial, state, values) -> None:
        self._meanwhile()


@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_a_tell_racing_another_sweeps_end_of_its_trial_neither_overwrites_it_nor_runs_it_twice(tmp_path, storage):
    """The owner's tell had read its trial RUNNING when another sweep, taking it for dead, ended it FAIL and queued
    its retry. On SQLite the tell's unconditional write then ended it COMPLETE, carrying the other's reason, and
    the retry ran the params again (finding N4). The first end stands; the result is kept as a late one."""
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    from optuna_saturn.study.ownership import _end_orphan, run_again

    if storage == "sqlite":
        url: object = f"sqlite:///{tmp_path / 's.db'}"
        second = lambda: optuna.storages.RDBStorage(str(url))  # noqa: E731  # (another sweep: its own connection)
    else:
        url = JournalStorage(JournalFileBackend(str(tmp_path / "journal.log")))
        second = lambda: JournalStorage(JournalFileBackend(str(tmp_path / "journal.log")))  # noqa: E731
    other_sweep = Owner("sweep-b", "h", 1, 0.0)
    queued: list[int] = []

    def end_it_as_another_sweep() -> None:
        other = optuna.load_study(study_name=study.study_name, storage=second())
        frozen = other.trials[0]
        if _end_orphan(StudyGateway(other), frozen, "silent for 151 s", again=True, by=other_sweep):
            run_again(StudyGateway(other), frozen)
            queued.append(frozen.number)

    study = optuna.create_study(storage=url, sampler=_WaitsInAfterTrial(end_it_as_another_sweep))
    gateway = StudyGateway(study, owner=Owner.of_this_process().to_json())
    trial = gateway.ask_new()
    trial.suggest_float("x", 0, 1)
    told = gateway.tell(trial, TrialState.COMPLETE, [0.5], attrs={"strategy": "ddp"})
    trials = optuna.load_study(study_name=study.study_name, storage=second()).trials
    first = trials[0]
    assert queued == [0]
    assert told.state == first.state == TrialState.FAIL and first.values is None
    assert first.system_attrs["saturn:ended_by"] == "sweep-b"
    if storage == "sqlite":  # (one write there: the records of an end that lost land nowhere; a journal's came first)
        assert "saturn:strategy" not in first.system_attrs
    assert [(t.number, t.state, t.user_attrs.get("saturn:retry_of")) for t in trials[1:]] == [
        (1, TrialState.WAITING, 0)
    ]  # (one retry: the params run once more, not twice)
    late = optuna.load_study(study_name=study.study_name, storage=second()).user_attrs["saturn:late_result:0"]
    assert late["values"] == [0.5] and late["state"] == "COMPLETE"


def test_two_sweeps_in_one_process_telling_at_once_on_one_storage_keep_their_own_records(tmp_path):
    """Two gateways (two sweeps, two locks) on one storage object tell at once. Each tell's move stood in for the
    storage's own write on the shared object: interleaved, trial 0 got trial 1's records, trial 1's were lost, and
    the stand-in stayed on the object, so a later plain study.tell wrote trial 0's records onto another trial (a
    review of the tell's conditional write). One tell's move at a time, for its own trial only."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    entered = {n: threading.Event() for n in (0, 1)}
    release = {n: threading.Event() for n in (0, 1)}

    class Slow(optuna.samplers.RandomSampler):
        def after_trial(self, study, trial, state, values):
            if trial.number in entered:
                entered[trial.number].set()
                release[trial.number].wait(2)  # (forced: the other's tell starts meanwhile, where it can)

    study = optuna.create_study(storage=url, study_name="s", sampler=Slow())
    one, two = StudyGateway(study, owner={"sweep": "one"}), StudyGateway(study, owner={"sweep": "two"})
    zero, first = one.ask_new(), two.ask_new()
    tells = [
        threading.Thread(target=lambda: one.tell(zero, TrialState.COMPLETE, [0.0], attrs={"who": "zero"})),
        threading.Thread(target=lambda: two.tell(first, TrialState.COMPLETE, [1.0], attrs={"who": "one"})),
    ]
    tells[0].start()
    assert entered[0].wait(10)
    tells[1].start()
    entered[1].wait(3)
    release[0].set()
    tells[0].join(30)
    release[1].set()
    tells[1].join(30)
    stored = optuna.load_study(study_name="s", storage=url).trials
    assert [(t.state, t.values, t.system_attrs.get("saturn:who")) for t in stored] == [
        (TrialState.COMPLETE, [0.0], "zero"),
        (TrialState.COMPLETE, [1.0], "one"),
    ]
    assert "set_trial_state_values" not in vars(study._storage)
    later = study.ask()
    study.tell(later, 2.0)
    assert "saturn:who" not in optuna.load_study(study_name="s", storage=url).trials[2].system_attrs


def test_a_result_the_outbox_kept_does_not_overwrite_another_sweeps_end_of_its_trial(tmp_path, monkeypatch):
    """A restarted sweep tells a dead sweep's result from the outbox; another sweep ends the same orphan right
    before the tell's write, after its read (forced: at the write, whichever writes it). The tell from the outbox
    was a plain study.tell, whose write overwrote that end: COMPLETE with the other's reason (a review of the N4
    fix). The first end stands, and nothing is counted as told."""
    from optuna.storages._rdb import models

    from optuna_saturn.study import moves
    from optuna_saturn.study.outbox import Outbox, Outgoing

    url = f"sqlite:///{tmp_path / 's.db'}"
    dead = StudyGateway(optuna.create_study(storage=url, study_name="s"), owner={"sweep": "dead"})
    trial = dead.ask_new()
    Outbox(tmp_path / "outbox").keep_if_it_can(Outgoing(trial._trial_id, trial.number, "COMPLETE", [0.5], {}))
    ended = []

    def end_it_as_another_sweep() -> None:
        if not ended:
            ended.append(True)
            other = optuna.load_study(study_name="s", storage=optuna.storages.RDBStorage(url))
            attrs = {"saturn:fail_reason": "silent for 151 s", "saturn:ended_by": "other"}
            running, failed = TrialState.RUNNING, TrialState.FAIL
            assert moves.move(other._storage, trial._trial_id, expected=running, to=failed, attrs=attrs)

    conditional, read = moves._conditional_update, models.TrialModel.find_or_raise_by_id.__func__

    def end_first(rdb, trial_id, expected, to, *args, **kwargs):
        if to == TrialState.COMPLETE:  # (this sweep's conditional write of the end)
            end_it_as_another_sweep()
        return conditional(rdb, trial_id, expected, to, *args, **kwargs)

    def read_then_end(cls, trial_id, session, for_update=False):
        row = read(cls, trial_id, session, for_update)
        if for_update:  # (Optuna's own write of an end: its read, then its unconditional write)
            end_it_as_another_sweep()
        return row

    monkeypatch.setattr(moves, "_conditional_update", end_first)
    monkeypatch.setattr(models.TrialModel, "find_or_raise_by_id", classmethod(read_then_end))
    restarted = StudyGateway(
        optuna.load_study(study_name="s", storage=url), outbox=Outbox(tmp_path / "outbox"), owner={"sweep": "again"}
    )
    assert restarted.tell_what_the_outbox_kept(lambda trial: True) == []
    assert ended
    (stored,) = optuna.load_study(study_name="s", storage=url).trials
    assert stored.state == TrialState.FAIL and stored.values is None
    assert stored.system_attrs["saturn:ended_by"] == "other"
