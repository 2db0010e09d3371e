"""A trial's state moves that only one process may make: a take out of the queue (WAITING to RUNNING) and the end
of an orphan (RUNNING to FAIL).

Why not ``set_trial_state_values`` alone: Optuna's RDB storage reads the trial with ``SELECT ... FOR UPDATE``,
then writes. SQLite ignores ``FOR UPDATE``, and Python's sqlite3 reads outside a transaction, so two processes can
both read WAITING (or RUNNING) and both make the move: two sweeps ran one queued trial, or both ended one orphan
and both queued it again (measured, reliability review findings 7 and 10). On an RDB storage the move is therefore
one conditional ``UPDATE ... WHERE state = <expected>``, whose row count says whether this process made it: atomic
in SQLite itself, and in PostgreSQL and MySQL, with no lock file to share, spell or wait on. Journal and in-memory
storages decide their moves in one place (the log's order, a lock), so their own call is used.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import optuna
import sqlalchemy
from optuna.storages import BaseStorage, RDBStorage
from optuna.storages._rdb import models
from optuna.trial import TrialState

from optuna_saturn.study.attr_writes import write_records
from optuna_saturn.study.records import split


def move(
    storage: BaseStorage, trial_id: int, *, expected: TrialState, to: TrialState, attrs: dict[str, Any] | None = None
) -> bool:
    """Move trial ``trial_id`` from ``expected`` to ``to``, with records ``attrs``; False if it was not in
    ``expected`` when the storage made the write (another process moved it first). On an RDB storage the
    attributes are written in the move's own transaction, only by the process that made it: a sweep that loses
    the race leaves no reason or name of its own on a trial another ended."""
    rdb: Any = getattr(storage, "_backend", storage)  # (Optuna wraps an RDB storage in a cache)
    if isinstance(rdb, RDBStorage):
        return _conditional_update(rdb, trial_id, expected, to, attrs or {})
    if storage.get_trial(trial_id).state != expected:
        return False
    try:
        write_records(storage, trial_id, attrs or {})
        return storage.set_trial_state_values(trial_id, to)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False


def _conditional_update(
    rdb: RDBStorage, trial_id: int, expected: TrialState, to: TrialState, attrs: dict[str, Any]
) -> bool:
    trials = models.TrialModel.__table__
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    if not hasattr(models.TrialModel, "_datetime_start_utc"):  # (Optuna before 5 stores local time; 5, naive UTC)
        now = datetime.datetime.now()
    values: dict[str, Any] = {"state": to}
    if to == TrialState.RUNNING:
        values["datetime_start"] = now
    if to.is_finished():
        values["datetime_complete"] = now
    statement = (
        sqlalchemy.update(trials).where(trials.c.trial_id == trial_id, trials.c.state == expected).values(**values)
    )
    user, system = split(attrs)
    with rdb.engine.begin() as connection:
        if connection.execute(statement).rowcount != 1:
            return False
        for model, part in ((models.TrialUserAttributeModel, user), (models.TrialSystemAttributeModel, system)):
            attributes = model.__table__
            for key, value in part.items():
                mine = (attributes.c.trial_id == trial_id) & (attributes.c.key == key)
                connection.execute(sqlalchemy.delete(attributes).where(mine))
                connection.execute(
                    sqlalchemy.insert(attributes).values(trial_id=trial_id, key=key, value_json=json.dumps(value))
                )
        return True
