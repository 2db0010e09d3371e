"""The sweep's one clock, passed in: wall time in a real sweep, virtual time in a simulated one.

Why passed in: the simulator runs the real loop (DESIGN.md decision 12), so nothing the loop, its policies, the
trial sessions or stall detection decide may read the time of its own accord. Syne Tune's simulator backend runs
its real tuner in virtual time too, and has to patch the stop criterion that reads real time; here no such patch
is needed, because there is nothing else to read.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Seconds, on one time line: the sweep's start is ``now()`` when it starts."""

    def now(self) -> float:
        """The current time, in seconds (since the epoch, for a wall clock)."""


class WallClock:
    """The machine's time (``time.time()``): real sweeps, whose times are shown as dates and stored."""

    def now(self) -> float:
        return time.time()


class VirtualClock:
    """Time that moves only when told to: the simulated pool moves it to its next event, and the simulated
    pricing by the time describing a trial took in the sweep it replays."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        """Move to ``t``; never back (events of the past happened already)."""
        self._now = max(self._now, float(t))

    def advance_by(self, seconds: float) -> None:
        self._now += max(0.0, float(seconds))
