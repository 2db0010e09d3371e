"""What the progress views show: per-trial and whole-sweep estimates, tracked from the sweep's events."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import optuna

from optuna_saturn.events import TrialMove, TrialProgress, TrialStart
from optuna_saturn.planner import Plan

#: The states a trial ends in.
FINISHED = ("COMPLETE", "PRUNED", "FAIL")


@dataclass
class TrialStatus:
    """What is known of one trial of the running sweep. Times are seconds since the sweep started."""

    number: int
    strategy: str
    devices: tuple[str, ...]
    state: str = "WAITING"
    planned_start: float | None = None
    planned_end: float | None = None
    start: float | None = None
    end: float | None = None
    step: int = 0
    total: int | None = None
    step_seconds: float | None = None
    values: tuple[float, ...] | None = None

    def remaining(self, now: float) -> float | None:
        """Seconds until this trial ends: from its step rate when it reports one, else from its plan."""
        if self.state in FINISHED:
            return 0.0
        if self.state == "RUNNING" and self.total and self.step_seconds is not None:
            return max(0, self.total - self.step) * self.step_seconds
        if self.planned_end is None:
            return None
        if self.state == "RUNNING" and self.start is not None and self.planned_start is not None:
            return max(0.0, self.start + (self.planned_end - self.planned_start) - now)
        return max(0.0, self.planned_end - now)


@dataclass
class SweepTracker:
    """Turns sweep events into per-trial states and estimates; shared by every progress view."""

    started_at: float = field(default_factory=time.time)
    devices: tuple[str, ...] = ()
    trials: dict[int, TrialStatus] = field(default_factory=dict)
    workers_ready_at: float | None = None  # seconds after the start; None while the workers start

    def now(self) -> float:
        return time.time() - self.started_at

    def sweep_start(self, devices: Sequence[str], started_at: float) -> None:
        self.started_at, self.devices, self.trials = started_at, tuple(devices), {}
        self.workers_ready_at = None

    def plan(self, plan: Plan, now: float) -> None:
        for a in plan.assignments:
            self.trials[int(a.job)] = TrialStatus(
                number=int(a.job),
                strategy=a.option.strategy,
                devices=tuple(self.devices[i] if i < len(self.devices) else f"device:{i}" for i in a.devices),
                planned_start=now + a.start,
                planned_end=now + a.end,
            )

    def trial_start(self, start: TrialStart) -> TrialStatus:
        status = self.trials.setdefault(start.number, TrialStatus(start.number, start.strategy, start.devices))
        status.state, status.start, status.devices = "RUNNING", start.start, tuple(start.devices)
        status.strategy = start.strategy  # the plan's choice may change at the start (another option ends sooner)
        status.planned_start, status.planned_end = start.planned_start, start.planned_end
        return status

    def trial_progress(self, progress: TrialProgress) -> TrialStatus | None:
        status = self.trials.get(progress.number)
        if status is not None:
            status.step, status.total, status.step_seconds = progress.step, progress.total, progress.step_seconds
        return status

    def trial_end(self, trial: optuna.trial.FrozenTrial, now: float) -> TrialStatus:
        status = self.trials.setdefault(trial.number, TrialStatus(trial.number, "?", ()))
        status.state, status.end = trial.state.name, now
        status.values = tuple(trial.values) if trial.values is not None else None
        return status

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for status in self.trials.values():
            counts[status.state] = counts.get(status.state, 0) + 1
        return counts

    def sweep_remaining(self, now: float) -> float | None:
        """Seconds until every planned trial has ended: running ones from their rate, waiting ones from the plan,
        pushed back by how late the running ones are. Trials not asked yet are not counted."""
        pending = [s for s in self.trials.values() if s.state not in FINISHED]
        if not pending:
            return 0.0 if self.trials else None
        lateness = 0.0
        for s in pending:
            left = s.remaining(now)
            if s.state == "RUNNING" and left is not None and s.planned_end is not None:
                lateness = max(lateness, now + left - s.planned_end)
        ends = []
        for s in pending:
            left = s.remaining(now)
            if left is None:
                return None
            ends.append(now + left + (lateness if s.state == "WAITING" else 0.0))
        return max(ends) - now


def format_duration(seconds: float | None) -> str:
    """``75.2`` -> ``"1:15"``; ``3700`` -> ``"1:01:40"``; ``None`` -> ``"-"``."""
    if seconds is None:
        return "-"
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def describe_move(move: TrialMove) -> str:
    if move.phase == "asked":
        return f"trial {move.number} moves from {move.from_option} to {move.to_option} at its next checkpoint" + (
            f": {move.summary}" if move.summary else ""
        )
    return f"trial {move.number} stopped under {move.from_option} at step {move.step}, to go on under another option"
