"""Listening to a sweep: progress displays, dashboard publishers and reports subscribe here.

The sweep calls every listener from its own (main) thread. A listener must be quick and must not raise: an
exception is logged and the listener is dropped, the sweep goes on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import optuna

from optuna_saturn.planner import Plan


@dataclass(frozen=True)
class TrialStart:
    number: int
    strategy: str
    devices: tuple[str, ...]
    planned_start: float  # seconds since the sweep started
    planned_end: float
    start: float


@dataclass(frozen=True)
class TrialProgress:
    number: int
    step: int
    total: int | None
    step_seconds: float | None


@dataclass(frozen=True)
class ProfileEvent:
    """A profiling run of the batch being prepared: ``phase`` is "started" or "done"; ``summary`` says what
    was measured (step time, start-up, peak memory) or why nothing was."""

    trial: int
    option: str  # e.g. "ddpx2"
    phase: str
    summary: str = ""


@dataclass(frozen=True)
class TrialMove:
    """Elastic resize of a running trial: ``phase`` "asked" (it stops at its next checkpoint, to go on under
    ``to_option``; ``summary`` says what the plan gains) or "stopped" (it did, at ``step``; it starts again
    under the option the next plan gives it)."""

    number: int
    from_option: str  # e.g. "singlex1"
    to_option: str
    phase: str
    step: int = 0
    summary: str = ""


class SweepListener:
    """Override what you need; every method defaults to doing nothing. Times are seconds since the sweep began."""

    def on_sweep_start(self, study: optuna.Study, devices: Sequence[str], started_at: float) -> None:
        """``started_at`` is the epoch time the sweep began (the origin of every other time)."""

    def on_workers_ready(self, study: optuna.Study, now: float) -> None:
        """Every device's worker is up (the first time): until then the sweep was starting them."""

    def on_plan(self, study: optuna.Study, plan: Plan, trial_numbers: Sequence[int], now: float) -> None:
        """A batch was planned; the plan's times are relative to ``now``."""

    def on_profile(self, study: optuna.Study, event: ProfileEvent) -> None:
        pass

    def on_trial_start(self, study: optuna.Study, start: TrialStart) -> None:
        pass

    def on_trial_progress(self, study: optuna.Study, progress: TrialProgress) -> None:
        pass

    def on_trial_move(self, study: optuna.Study, move: TrialMove) -> None:
        pass

    def on_trial_end(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, now: float) -> None:
        pass

    def on_sweep_end(self, study: optuna.Study, now: float, interrupted: bool) -> None:
        pass


class Broadcast:
    """Tells every listener of a sweep; one that raises is logged and dropped, and the sweep goes on."""

    def __init__(self, listeners: Sequence[SweepListener], study: optuna.Study) -> None:
        self._listeners = list(listeners)
        self._study = study

    def send(self, method: str, *args: object) -> None:
        for listener in list(self._listeners):
            handler = getattr(listener, method, None)
            if handler is None:  # (a listener written before this event existed, not a SweepListener)
                continue
            try:
                handler(self._study, *args)
            except Exception:
                optuna.logging.get_logger("optuna.saturn").exception(
                    f"Listener {listener!r} failed in {method}; it is dropped, the sweep goes on."
                )
                self._listeners.remove(listener)
