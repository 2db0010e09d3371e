"""A trial's state moves that only one process may make: a take out of the queue (WAITING to RUNNING), the end of an
orphan (RUNNING to FAIL), and its owner's tell (RUNNING to its end, with its values).

Why not ``set_trial_state_values`` alone: Optuna's RDB storage reads the trial with ``SELECT ... FOR UPDATE``,
then writes. SQLite ignores ``FOR UPDATE``, and Python's sqlite3 reads outside a transaction, so two processes can
both read WAITING (or RUNNING) and both make the move: two sweeps ran one queued trial, or both ended one orphan
and both queued it again (measured, reliability review findings 7 and 10). On an RDB storage the move is therefore
one conditional ``UPDATE ... WHERE state = <expected>``, whose row count says whether this process made it: atomic
in SQLite itself, and in PostgreSQL and MySQL, with no lock file to share, spell or wait on. Journal and in-memory
storages decide their moves in one place (the log's order, a lock), so their own call is used; there, the records
of an end are written before it (a finished trial takes none), and the process whose records stand on the ended
trial is the one that ended it (reliability review 3, finding N8).

The owner's tell is one too (:func:`tell_if_running`): Optuna's ``study.tell`` reads the trial RUNNING, calls the
sampler, then writes the end unconditionally, and on SQLite another sweep's orphan end can land in between. The
tell then overwrote it: the trial ended COMPLETE carrying the other's reason, and its retry ran the params again
(finding N4).
"""

from __future__ import annotations

import contextlib
import datetime
import threading
from collections.abc import Sequence
from typing import Any

import optuna
import sqlalchemy
from optuna.storages import BaseStorage, RDBStorage
from optuna.storages._rdb import models
from optuna.storages._rdb.storage import _create_scoped_session
from optuna.trial import TrialState

from optuna_saturn.study.attr_writes import upsert, write_records
from optuna_saturn.study.records import split


def move(
    storage: BaseStorage,
    trial_id: int,
    *,
    expected: TrialState,
    to: TrialState,
    attrs: dict[str, Any] | None = None,
    values: Sequence[float] | None = None,
    signed_by: str | None = None,
) -> bool:
    """Move trial ``trial_id`` from ``expected`` to ``to``, with records ``attrs`` (and ``values``, for an end);
    False if another process moved it first. On an RDB storage the attributes are written in the move's own
    transaction, only by the process that made it: a sweep that loses the race leaves no reason or name of its
    own on a trial another ended. ``signed_by``: the record of ``attrs`` that names who makes the move
    (``saturn:ended_by``); where the storage cannot say whose end it took (a journal), the end is this process's
    when that name stands on the ended trial."""
    rdb: Any = getattr(storage, "_backend", storage)  # (Optuna wraps an RDB storage in a cache)
    if isinstance(rdb, RDBStorage):
        return _conditional_update(rdb, trial_id, expected, to, attrs or {}, values)
    if storage.get_trial(trial_id).state != expected:
        return False
    try:
        write_records(storage, trial_id, attrs or {})
        moved = storage.set_trial_state_values(trial_id, to, values)
    except optuna.exceptions.UpdateFinishedTrialError:
        moved = False
    if signed_by is None or not to.is_finished():
        return moved  # (a take, or an unsigned end: the storage's answer says whose it is)
    # Two processes that end one trial at once both write their records, each record one write, then their moves;
    # the first move ends it, with the name written last before it, and later writes are refused. So the name on
    # it says who ended it, whichever move answered True: that one, and only that one, queues its retry.
    stored = storage.get_trial(trial_id)
    name = {**stored.user_attrs, **stored.system_attrs}.get(signed_by)
    return stored.state == to and name == (attrs or {}).get(signed_by)


def tell_if_running(
    study: optuna.Study, trial: optuna.Trial, state: TrialState, values: list[float] | None, attrs: dict[str, Any]
) -> optuna.trial.FrozenTrial:
    """``study.tell(trial, values, state=state)`` with the records ``attrs``, whose write ends the trial only if it
    is still RUNNING then (on an RDB storage: one conditional write of the end, its values and records). Returns
    the trial as stored: someone else's end, if theirs came first. (Called under the study's lock: the storage's
    ``set_trial_state_values`` is this move for this trial while the tell runs: one tell at a time in this
    process, whatever sweep's, so that two never stack their moves on one storage object.)"""
    storage = study._storage
    rdb: Any = getattr(storage, "_backend", storage)
    if not isinstance(rdb, RDBStorage):  # (the log's order, or a lock, makes the storage's own tell one move)
        write_records(storage, trial._trial_id, attrs)
        return study.tell(trial, values, state=state)

    with _TELLING:
        had_own = "set_trial_state_values" in vars(storage)
        original = storage.set_trial_state_values

        def end_if_running(trial_id: int, state: TrialState, values: Sequence[float] | None = None) -> bool:
            if trial_id != trial._trial_id:  # (a sampler's after_trial that tells another trial: as it was)
                return bool(original(trial_id, state, values))
            return _conditional_update(rdb, trial_id, TrialState.RUNNING, state, attrs, values)

        storage.set_trial_state_values = end_if_running  # type: ignore[method-assign]  # (this object, this tell)
        try:
            return study.tell(trial, values, state=state)
        finally:
            if had_own:
                storage.set_trial_state_values = original  # type: ignore[method-assign]
            else:
                with contextlib.suppress(AttributeError):
                    del storage.set_trial_state_values


#: Held while a tell's move stands in for its storage's ``set_trial_state_values`` (see :func:`tell_if_running`).
_TELLING = threading.RLock()


def _conditional_update(
    rdb: RDBStorage,
    trial_id: int,
    expected: TrialState,
    to: TrialState,
    attrs: dict[str, Any],
    values: Sequence[float] | None = None,
) -> bool:
    trials = models.TrialModel.__table__
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    if not hasattr(models.TrialModel, "_datetime_start_utc"):  # (Optuna before 5 stores local time; 5, naive UTC)
        now = datetime.datetime.now()
    columns: dict[str, Any] = {"state": to}
    if to == TrialState.RUNNING:
        columns["datetime_start"] = now
    if to.is_finished():
        columns["datetime_complete"] = now
    statement = (
        sqlalchemy.update(trials).where(trials.c.trial_id == trial_id, trials.c.state == expected).values(**columns)
    )
    user, system = split(attrs)
    with _create_scoped_session(rdb.scoped_session) as session:
        if session.execute(statement).rowcount != 1:  # type: ignore[attr-defined]  # (an UPDATE's result has it)
            return False
        trial_values = models.TrialValueModel.__table__
        for objective, value in enumerate(values or ()):
            stored, kind = models.TrialValueModel.value_to_stored_repr(float(value))
            session.execute(
                sqlalchemy.insert(trial_values).values(
                    trial_id=trial_id, objective=objective, value=stored, value_type=kind
                )
            )
        for model, part in ((models.TrialUserAttributeModel, user), (models.TrialSystemAttributeModel, system)):
            upsert(rdb, session, model, trial_id, part)
        return True
