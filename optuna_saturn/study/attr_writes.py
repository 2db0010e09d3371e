"""A trial's records written together: one storage transaction where the storage allows it.

Optuna's ``Trial.set_user_attr`` and ``set_trial_system_attr`` are one transaction per key, and on an RDB storage
each is a commit (on SQLite, a write of the database file to disk). A sweep records twenty-odd attributes when a
trial ends; written one by one they cost a short trial more than its own work (a review measured a tell at 420 ms
on SQLite). An RDB storage takes them in one transaction here, as one multi-row form of the upsert Optuna's own
setters run per key (a statement per key still cost a tell 20 ms on SQLite); other storages get one write per
key. Optuna's cache (``_CachedStorage``) passes attribute writes of unfinished trials straight to its backend and
reads those trials again, so writing to the backend skips nothing.

What goes where is :mod:`optuna_saturn.study.records`' rule: the sweep's records to system attributes, its two
public ones to user attributes.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.storages import BaseStorage, RDBStorage
from sqlalchemy.dialects import mysql, postgresql, sqlite

from optuna_saturn.study.records import split


def write_records(storage: BaseStorage, trial_id: int, attrs: Mapping[str, Any]) -> None:
    """Set the ``saturn:`` records ``attrs`` on trial ``trial_id``, together where the storage allows it."""
    if not attrs:
        return
    user, system = split(attrs)
    backend = getattr(storage, "_backend", storage)  # (Optuna wraps an RDB storage in its cache)
    if isinstance(backend, RDBStorage):
        try:
            from optuna.storages._rdb import models
            from optuna.storages._rdb.storage import _create_scoped_session
        except ImportError:  # (an Optuna whose RDB storage is laid out otherwise: one write per key)
            pass
        else:
            with _create_scoped_session(backend.scoped_session, True) as session:
                trial = models.TrialModel.find_or_raise_by_id(trial_id, session)
                backend.check_trial_is_updatable(trial_id, trial.state)
                for model, part in ((models.TrialUserAttributeModel, user), (models.TrialSystemAttributeModel, system)):
                    upsert(backend, session, model, trial_id, part)
            return
    for key, value in user.items():
        storage.set_trial_user_attr(trial_id, key, value)
    for key, value in system.items():
        storage.set_trial_system_attr(trial_id, key, value)


def upsert(backend: RDBStorage, session: Any, model: Any, trial_id: int, part: Mapping[str, Any]) -> None:
    """All of ``part`` in one INSERT ... ON CONFLICT statement where the database has one (as Optuna's own setter
    has per key: a statement per key costs a short trial's tell more than its storage's commit); else Optuna's
    setter per key."""
    if not part:
        return
    rows = [{"trial_id": trial_id, "key": key, "value_json": json.dumps(value)} for key, value in part.items()]
    dialect = backend.engine.name
    statement: Any
    if dialect == "postgresql" or (dialect == "sqlite" and sqlite3.sqlite_version_info >= (3, 24, 0)):
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        values = insert(model).values(rows)
        statement = values.on_conflict_do_update(
            index_elements=[model.trial_id, model.key], set_={"value_json": values.excluded.value_json}
        )
    elif dialect == "mysql":
        on_mysql = mysql.insert(model).values(rows)
        statement = on_mysql.on_duplicate_key_update(value_json=on_mysql.inserted.value_json)
    else:
        for key, value in part.items():
            backend._set_trial_attr_without_commit(session, model, trial_id, key, value)
        return
    session.execute(statement)


def set_records_of(storage: BaseStorage, trial: Any, attrs: Mapping[str, Any]) -> None:
    """``attrs`` on a running ``optuna.Trial`` (written together, and kept on the trial object as its own setters
    keep them), or on a queued trial not taken yet (its own copy, written when it is taken)."""
    user, system = split(attrs)
    if isinstance(trial, optuna.Trial):
        write_records(storage, trial._trial_id, attrs)
        trial._cached_frozen_trial.user_attrs.update(user)
        trial._cached_frozen_trial.system_attrs.update(system)
        return
    trial.records.update(system)
    for key, value in user.items():
        trial.set_user_attr(key, value)
