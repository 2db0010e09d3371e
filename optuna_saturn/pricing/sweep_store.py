"""The profile store as one sweep sees it: an out-of-memory on a GPU that another process holds stays in the sweep.

Why: an option that ran out of memory is stored as infeasible, and every later sweep on that hardware skips it.
When a notebook, another user or a leftover process held memory on one of the pool's GPUs, the out-of-memory may
be its fault, not the option's: stored for good, it would cost a later sweep on a free GPU its best option. Such a
record is kept for this sweep only (it still leaves the option out here, where the other process still is), with
the reason in its error, which the trial's profiles show.

When: other processes hold more than :data:`~optuna_saturn.profiler._hardware.SHARED_MARGIN` on a GPU of the
pool, at the sweep's start or when the record is stored. The pricer does not know which of the pool's GPUs the
run used, so any of them counts: a record kept that need not have been is measured again next sweep, no worse.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import optuna

from optuna_saturn.devices import Device
from optuna_saturn.profiler import ProfileRecord, ProfileStore
from optuna_saturn.profiler._hardware import shared_gpus

_logger = optuna.logging.get_logger("optuna.saturn.profiler")


class SweepStore:
    """``store``, with the out-of-memory records this sweep keeps to itself (read first: they are newer)."""

    def __init__(self, store: ProfileStore, pool: Sequence[Device]) -> None:
        self._store = store
        self._pool = list(pool)
        self._shared_at_start = shared_gpus(self._pool)
        self._here: dict[str, ProfileRecord] = {}

    def get(self, key: str) -> ProfileRecord | None:
        return self._here.get(key) or self._store.get(key)

    def records(self) -> list[ProfileRecord]:
        return self._store.records()

    def put(self, record: ProfileRecord) -> None:
        """Store ``record``; an out-of-memory while another process holds GPU memory in the pool: for this sweep."""
        shared = [] if record.feasible else (shared_gpus(self._pool) or self._shared_at_start)
        if not shared:
            self._here.pop(record.key, None)
            self._store.put(record)
            return
        why = f"other processes hold memory on {'; '.join(shared)}"
        self._here[record.key] = dataclasses.replace(
            record, error=f"{record.error} [kept for this sweep only, not in the profile store: {why}]"
        )
        _logger.warning(
            f"{record.strategy} ×{record.devices} ran out of memory while {why}: it is left out for this sweep "
            "only, not stored in the profile store as the option's fault."
        )
