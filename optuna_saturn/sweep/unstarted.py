"""The queue's unstarted trials once asking stops: which stay in the study's queue (WAITING, for the next
``optimize``) and which still start here."""

from __future__ import annotations

from optuna_saturn.sweep.asking import Asking
from optuna_saturn.sweep.decisions import KeepQueued
from optuna_saturn.sweep.policy import Decisions, Policy, Round
from optuna_saturn.sweep.state import SweepState


class Unstarted(Policy):
    """Once ``asking`` stopped (:meth:`~optuna_saturn.sweep.asking.Asking.stopped`), the queued trials it described
    and no device started go back to the queue. Its own memory: the trials owed a start, decided once."""

    def __init__(self, asking: Asking) -> None:
        self._asking = asking
        self._owed_a_start: set[int] | None = None  # queued trials to run although asking stopped

    def on_round(self, round: Round) -> Decisions:
        if not self._asking.stopped(round.state, round.now, round.stop_requested):
            return []
        return [KeepQueued(number) for number in self.not_to_start(round.state)]

    def not_to_start(self, state: SweepState) -> list[int]:
        """Asking stopped: the queued trials described and not started stay in the study's queue (WAITING, for
        the next optimize), except those owed a start: a first trial for each device that has run no job yet
        (its worker was starting, or the trial was being described), planned there (the device is free now,
        whenever the plan would start it) or not planned yet. Those would run but for the sweep's start-up
        (plain Optuna's first trials start at once, one per thread, and its timeout lets them finish). Which are
        owed a start is decided once, one per device."""
        if self._owed_a_start is None:
            self._owed_a_start = set()
            without_a_job = {d for d in state.free() if d not in state.idle_seconds}
            queued = sorted(
                (w for w in state.waiting.values() if w.queued),
                key=lambda w: (w.assignment is None, w.planned_start if w.assignment else 0.0, w.number),
            )
            for waiting in queued:
                if waiting.assignment is None:  # (described, not planned yet: it takes a device of its own)
                    devices = {min(without_a_job)} if without_a_job else {-1}
                else:
                    devices = set(waiting.assignment.devices)
                if devices <= without_a_job:
                    self._owed_a_start.add(waiting.number)
                    without_a_job -= devices
        return [n for n, w in state.waiting.items() if w.queued and n not in self._owed_a_start]
