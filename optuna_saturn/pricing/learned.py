"""What the profiles learned on this hardware say about a workload not yet measured: its start-up and the time
after its loop, as medians.

Why a window and a cache: every waiting trial is re-priced after each end that teaches the pricer something, and a
median over the whole growing history there made the loop slow down as a long sweep went on (quadratically when
workloads vary). The latest :data:`LEARNED_WINDOW` profiles are kept, and their medians computed once per change.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Iterable

from optuna_saturn.profiler import ProfileRecord

#: How many of the latest profiles learned on this hardware price an unmeasured workload's start-up and end.
LEARNED_WINDOW = 256


def overheads(records: Iterable[ProfileRecord]) -> tuple[float, float]:
    """The median start-up and after-the-loop seconds of ``records`` (none: 0, 0)."""
    listed = list(records)
    if not listed:
        return 0.0, 0.0
    return (
        statistics.median(r.startup_seconds or 0.0 for r in listed),
        statistics.median(r.after_loop_seconds for r in listed),
    )


class LearnedOverheads:
    """The latest learned profiles and their medians."""

    def __init__(self, window: int = LEARNED_WINDOW) -> None:
        self._records: collections.deque[ProfileRecord] = collections.deque(maxlen=window)
        self._medians: tuple[float, float] | None = None

    def add(self, record: ProfileRecord) -> None:
        self._records.append(record)
        self._medians = None

    def __bool__(self) -> bool:
        return bool(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def overheads(self) -> tuple[float, float]:
        """The median start-up and end of the latest profiles, computed once per change."""
        if self._medians is None:
            self._medians = overheads(self._records)
        return self._medians
