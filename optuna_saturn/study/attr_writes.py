"""A trial's attributes written together: one storage transaction where the storage allows it.

Optuna's ``Trial.set_user_attr`` is one transaction per key, and on an RDB storage each is a commit (on SQLite, a
write of the database file to disk). A sweep records twenty-odd attributes when a trial ends; written one by one
they cost a short trial more than its own work (a review measured a tell at 420 ms on SQLite). An RDB storage
takes them in one transaction here, through the same statement Optuna's own ``set_trial_user_attr`` runs per key;
other storages get one write per key, as before. Optuna's cache (``_CachedStorage``) passes attribute writes of
unfinished trials straight to its backend and reads those trials again, so writing to the backend skips nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna
from optuna.storages import BaseStorage, RDBStorage


def set_user_attrs(storage: BaseStorage, trial_id: int, attrs: Mapping[str, Any]) -> None:
    """Set every one of ``attrs`` on trial ``trial_id``, together where the storage allows it."""
    if not attrs:
        return
    backend = getattr(storage, "_backend", storage)  # (Optuna wraps an RDB storage in its cache)
    if isinstance(backend, RDBStorage):
        try:
            from optuna.storages._rdb import models
            from optuna.storages._rdb.storage import _create_scoped_session
        except ImportError:  # (an Optuna whose RDB storage is laid out otherwise: one write per key)
            pass
        else:
            with _create_scoped_session(backend.scoped_session, True) as session:
                for key, value in attrs.items():
                    backend._set_trial_attr_without_commit(
                        session, models.TrialUserAttributeModel, trial_id, key, value
                    )
            return
    for key, value in attrs.items():
        storage.set_trial_user_attr(trial_id, key, value)


def set_attrs_of(storage: BaseStorage, trial: Any, attrs: Mapping[str, Any]) -> None:
    """``attrs`` on a running ``optuna.Trial`` (written together, and kept on the trial object as its own
    ``set_user_attr`` keeps them), or on a queued trial not taken yet (its own copy)."""
    if isinstance(trial, optuna.Trial):
        set_user_attrs(storage, trial._trial_id, attrs)
        trial._cached_frozen_trial.user_attrs.update(attrs)
        return
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
