"""Storage handles of their own, for the threads that must not wait behind the sweep's: the heartbeat and the
dashboard publisher.

Why a handle of their own: an RDB storage's calls share one connection pool and, under the sweep, one lock; a
heartbeat queued behind a slow sampler or a long write goes unwritten, and other sweeps take this live one for
dead. A second engine on the same URL writes at once. Other storages (journal files, in-memory) are safe to call
from any thread and hold no pool, so they are shared.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.storages import BaseStorage, RDBStorage


def own_handle(storage: BaseStorage) -> BaseStorage:
    """A handle on the same storage that shares no connection pool with ``storage``."""
    backend: Any = getattr(storage, "_backend", storage)  # (Optuna wraps an RDB storage in a cache)
    if isinstance(backend, RDBStorage) and not backend.url.startswith("sqlite:///:memory:"):
        return RDBStorage(
            backend.url,
            engine_kwargs=dict(backend.engine_kwargs),
            skip_compatibility_check=True,
            skip_table_creation=True,
        )
    return storage


def close_handle(handle: BaseStorage, original: BaseStorage) -> None:
    """Close the connections of a handle :func:`own_handle` made (a shared one is left alone)."""
    if handle is not original and isinstance(handle, RDBStorage):
        handle.engine.dispose()


def set_study_attr(storage: BaseStorage, study: optuna.Study, key: str, value: Any) -> None:
    """Set a study's user attribute through ``storage`` (one of :func:`own_handle`'s)."""
    storage.set_study_user_attr(study._study_id, key, value)
