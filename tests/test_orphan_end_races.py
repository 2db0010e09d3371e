"""An orphan's end and its retry, where a storage's answer is lost or two sweeps end it at once: its params run
once more, never twice and never not at all (reliability review 3, findings N8 and N9)."""

from __future__ import annotations

import threading

import optuna
import sqlalchemy.exc
from optuna.storages.journal import JournalFileBackend, JournalStorage
from optuna.trial import TrialState

from optuna_saturn.study.gateway import StudyGateway
from optuna_saturn.study.liveness import HeartbeatWatch
from optuna_saturn.study.ownership import Owner, recovery_round


def _orphan_of_a_dead_sweep(study: optuna.Study) -> None:
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    trial.set_user_attr("saturn:owner", Owner("dead", "another-host", 1, 0.0).to_json())  # no heartbeat: gone


def _retries_of_the_first(trials: list[optuna.trial.FrozenTrial]) -> list[int]:
    return [t.number for t in trials if t.user_attrs.get("saturn:retry_of") == 0]


def test_two_sweeps_ending_one_orphan_on_a_journal_queue_one_retry_even_when_the_winners_answer_is_lost(tmp_path):
    """Forced order on a journal file: B writes its reason and name; C checks and writes its own; B's move lands
    but its answer is lost (an I/O error after the write); C's move is refused. The name left on the trial is C's,
    so B's next round, settling its lost answer by that name, queued nothing, and C, whose move was refused,
    queued nothing either: the retry was lost (finding N8). The sweep whose name stands queues it, once."""
    path = str(tmp_path / "journal.log")
    study = optuna.create_study(storage=JournalStorage(JournalFileBackend(path)), study_name="s")
    _orphan_of_a_dead_sweep(study)
    b_named, c_named, b_moved = threading.Event(), threading.Event(), threading.Event()

    def sweep_storage(name: str) -> JournalStorage:
        storage = JournalStorage(JournalFileBackend(path))  # (each sweep its own handle on the file)
        write_attr, write_move = storage.set_trial_system_attr, storage.set_trial_state_values

        def attr(trial_id, key, value):
            write_attr(trial_id, key, value)
            if key == "saturn:ended_by":
                (b_named if name == "B" else c_named).set()

        def move(trial_id, state, values=None):
            if name == "B":
                assert c_named.wait(10)  # (C has checked and written its own records)
                write_move(trial_id, state, values)
                b_moved.set()
                raise OSError(5, "Input/output error (the answer of a write that landed)")
            assert b_moved.wait(10)
            return write_move(trial_id, state, values)

        storage.set_trial_system_attr, storage.set_trial_state_values = attr, move
        return storage

    queued: dict[str, list[int]] = {}

    def sweep_b() -> None:
        storage = sweep_storage("B")
        gateway = StudyGateway(optuna.load_study(study_name="s", storage=storage))
        me, watch = Owner("sweep-b", "h2", 2, 0.0), HeartbeatWatch()
        queued["B round 1"] = recovery_round(gateway, me, max_retries=1, watch=watch)
        storage.set_trial_state_values = JournalStorage.set_trial_state_values.__get__(storage)  # (answers again)
        queued["B round 2"] = recovery_round(gateway, me, max_retries=1, watch=watch)

    def sweep_c() -> None:
        assert b_named.wait(10)
        gateway = StudyGateway(optuna.load_study(study_name="s", storage=sweep_storage("C")))
        queued["C"] = recovery_round(gateway, Owner("sweep-c", "h3", 3, 0.0), max_retries=1, watch=HeartbeatWatch())

    threads = [threading.Thread(target=sweep_b), threading.Thread(target=sweep_c)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    trials = optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(path))).trials
    assert trials[0].state == TrialState.FAIL
    named = trials[0].system_attrs["saturn:ended_by"]
    assert named == "sweep-c"  # (the forced order: C's records came last before B's move)
    assert queued == {"B round 1": [], "C": [0], "B round 2": []}, queued
    assert _retries_of_the_first(trials) == [1]


def test_a_retry_whose_enqueue_landed_but_whose_answer_was_lost_is_not_queued_again(tmp_path):
    """The retry's enqueue committed, then the storage raised (a restarting database drops the reply): the retry
    stayed due, and the next round queued the same params again, so they ran twice (finding N9)."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    _orphan_of_a_dead_sweep(study)
    gateway = StudyGateway(study, owner=Owner.of_this_process().to_json())
    create = study._storage.create_new_trial
    answers_lost = [sqlalchemy.exc.OperationalError("INSERT", {}, Exception("server closed the connection"))]

    def commit_then_lose_the_answer(study_id, template_trial=None):
        trial_id = create(study_id, template_trial)
        if answers_lost:
            raise answers_lost.pop()
        return trial_id

    study._storage.create_new_trial = commit_then_lose_the_answer
    me, watch = Owner.of_this_process(), HeartbeatWatch()
    first, second = (recovery_round(gateway, me, max_retries=1, watch=watch) for _ in range(2))
    assert (first, second) == ([], [0])  # (the round that lost the answer ended; the next found its retry queued)
    trials = study.get_trials(deepcopy=False)
    assert _retries_of_the_first(trials) == [1]
    assert recovery_round(gateway, me, max_retries=1, watch=watch) == []  # (and it is due no more)
    assert len(study.get_trials(deepcopy=False)) == 2


def test_two_sweeps_whose_record_writes_interleave_on_a_journal_leave_one_winner(tmp_path):
    """On a journal each record is a write of its own: A wrote its reason, B both its records, then A its name and
    its move, then B its move (refused). Judged by all its records, neither sweep had won, and no one queued the
    retry (a review of the journal's end). The name that stands on the ended trial decides: A's."""
    from optuna_saturn.study import moves

    path = str(tmp_path / "journal.log")
    study = optuna.create_study(storage=JournalStorage(JournalFileBackend(path)), study_name="s")
    trial_id = study.ask()._trial_id
    a, b = JournalStorage(JournalFileBackend(path)), JournalStorage(JournalFileBackend(path))
    a_reason_written, b_written = threading.Event(), threading.Event()
    write_a, move_b = a.set_trial_system_attr, b.set_trial_state_values

    def a_then_wait(trial_id, key, value):
        write_a(trial_id, key, value)
        if key == "saturn:fail_reason":
            a_reason_written.set()
            assert b_written.wait(10)

    def b_after_a(*args, **kwargs):
        b_written.set()
        ending_a.join(10)
        return move_b(*args, **kwargs)

    a.set_trial_system_attr, b.set_trial_state_values = a_then_wait, b_after_a
    won: dict[str, bool] = {}

    def end(name: str, storage: JournalStorage) -> None:
        attrs = {"saturn:fail_reason": f"silent ({name})", "saturn:ended_by": name}
        won[name] = moves.move(
            storage, trial_id, expected=TrialState.RUNNING, to=TrialState.FAIL, attrs=attrs, signed_by="saturn:ended_by"
        )

    ending_a = threading.Thread(target=end, args=("A", a))
    ending_a.start()
    assert a_reason_written.wait(10)
    end("B", b)
    stored = JournalStorage(JournalFileBackend(path)).get_trial(trial_id)
    assert stored.state == TrialState.FAIL and stored.system_attrs["saturn:ended_by"] == "A"
    assert won == {"A": True, "B": False}
