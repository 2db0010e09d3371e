"""Progress as plain log lines (a file, a CI log), or none."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import IO

import optuna

from optuna_saturn.events import ProfileEvent, SweepListener, TrialMove, TrialProgress, TrialStart
from optuna_saturn.planner import Plan
from optuna_saturn.progress.tracker import FINISHED, SweepTracker, describe_move, format_duration


class QuietProgress(SweepListener):
    """Shows nothing (the sweep's own log lines still go wherever logging sends them)."""


class PlainProgress(SweepListener):
    """One log line per plan, trial start and end, and per running trial at most every ``interval`` seconds.

    For output that is not a terminal (CI logs, ``nohup``, files), where a redrawn table would be noise.
    """

    def __init__(self, *, stream: IO[str] | None = None, interval: float = 30.0) -> None:
        self.stream = stream
        self.interval = interval
        self.tracker = SweepTracker()
        self._last_line: dict[int, float] = {}

    def _write(self, text: str) -> None:
        stream = self.stream or sys.stderr
        stream.write(f"[saturn {format_duration(self.tracker.now())}] {text}\n")
        stream.flush()

    def on_sweep_start(self, study: optuna.Study, devices: Sequence[str], started_at: float) -> None:
        self.tracker.sweep_start(devices, started_at)
        self._write(
            f"sweep of study {study.study_name!r} started on {len(devices)} device(s): {', '.join(devices)}; "
            "starting a worker on each (the objective's imports run once first)"
        )

    def on_workers_ready(self, study: optuna.Study, now: float) -> None:
        self.tracker.workers_ready_at = now
        self._write(f"workers ready on {len(self.tracker.devices)} device(s) after {now:.1f} s")

    def on_plan(self, study: optuna.Study, plan: Plan, trial_numbers: Sequence[int], now: float) -> None:
        self.tracker.plan(plan, now)
        chosen = ", ".join(f"#{a.job} {a.option.label}" for a in plan.assignments)
        self._write(
            f"planned {len(plan.assignments)} trial(s) ({chosen}); they end in ~{format_duration(plan.makespan)}"
        )

    def on_profile(self, study: optuna.Study, event: ProfileEvent) -> None:
        if event.phase == "done":
            self._write(f"profiled {event.option} for trial {event.trial}: {event.summary}")
        else:
            self._write(f"profiling {event.option} for trial {event.trial}")

    def on_trial_start(self, study: optuna.Study, start: TrialStart) -> None:
        status = self.tracker.trial_start(start)
        self._last_line[start.number] = self.tracker.now()
        self._write(
            f"trial {status.number} started: {status.strategy} on {', '.join(status.devices)}; "
            f"ETA {format_duration(status.remaining(start.start))}"
        )

    def on_trial_progress(self, study: optuna.Study, progress: TrialProgress) -> None:
        status = self.tracker.trial_progress(progress)
        now = self.tracker.now()
        if status is None or now - self._last_line.get(progress.number, 0.0) < self.interval:
            return
        self._last_line[progress.number] = now
        total = f"/{status.total}" if status.total else ""
        self._write(
            f"trial {status.number}: step {status.step}{total}, ETA {format_duration(status.remaining(now))}"
            f"; the trials planned so far end in {format_duration(self.tracker.sweep_remaining(now))}"
        )

    def on_trial_move(self, study: optuna.Study, move: TrialMove) -> None:
        self._write(describe_move(move))

    def on_trial_end(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, now: float) -> None:
        status = self.tracker.trial_end(trial, now)
        took = now - status.start if status.start is not None else None
        value = (
            f", value {', '.join(f'{v:.6g}' for v in status.values)}"
            if status.state == "COMPLETE" and status.values is not None
            else ""
        )
        counts = self.tracker.counts()
        done = sum(counts.get(s, 0) for s in FINISHED)
        self._write(
            f"trial {trial.number} {status.state} after {format_duration(took)}{value}; "
            f"{done}/{len(self.tracker.trials)} trials planned so far done, "
            f"the others end in {format_duration(self.tracker.sweep_remaining(now))}"
        )

    def on_sweep_end(self, study: optuna.Study, now: float, interrupted: bool) -> None:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.tracker.counts().items())) or "no trial ran"
        self._write(f"sweep {'interrupted' if interrupted else 'finished'} after {format_duration(now)}: {counts}")
