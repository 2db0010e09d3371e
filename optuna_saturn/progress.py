"""Live progress of a sweep: a rich table in a terminal or a notebook, plain log lines elsewhere, or nothing.

Why a listener: the sweep loop already reports plans, starts, step progress and ends
(:class:`~optuna_saturn.events.SweepListener`), so a display is only a view of those events. One tracker turns
them into per-trial and whole-sweep estimates; the views only format it. Use :func:`make_progress`.
"""

from __future__ import annotations

import io
import logging
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Literal

import optuna

from optuna_saturn.events import ProfileEvent, SweepListener, TrialMove, TrialProgress, TrialStart
from optuna_saturn.planner import Plan

ProgressMode = Literal["auto", "rich", "plain", "quiet"]
PROGRESS_MODES: tuple[str, ...] = ("auto", "rich", "plain", "quiet")
_FINISHED = ("COMPLETE", "PRUNED", "FAIL")


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
        if self.state in _FINISHED:
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
        pending = [s for s in self.trials.values() if s.state not in _FINISHED]
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
            f"planned {len(plan.assignments)} trial(s) ({chosen}); batch ends in ~{format_duration(plan.makespan)}"
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
            f"; sweep ETA {format_duration(self.tracker.sweep_remaining(now))}"
        )

    def on_trial_move(self, study: optuna.Study, move: TrialMove) -> None:
        self._write(describe_move(move))

    def on_trial_end(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, now: float) -> None:
        status = self.tracker.trial_end(trial, now)
        took = now - status.start if status.start is not None else None
        value = f", value {', '.join(f'{v:.6g}' for v in status.values)}" if status.state == "COMPLETE" else ""
        counts = self.tracker.counts()
        done = sum(counts.get(s, 0) for s in _FINISHED)
        self._write(
            f"trial {trial.number} {status.state} after {format_duration(took)}{value}; "
            f"{done}/{len(self.tracker.trials)} planned trials done, "
            f"sweep ETA {format_duration(self.tracker.sweep_remaining(now))}"
        )

    def on_sweep_end(self, study: optuna.Study, now: float, interrupted: bool) -> None:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.tracker.counts().items()))
        self._write(f"sweep {'interrupted' if interrupted else 'finished'} after {format_duration(now)}: {counts}")


class RichProgress(SweepListener):
    """A live table: per trial strategy, devices, state, step, elapsed time and ETA; below it, the sweep's ETA.

    While the table is shown, log handlers of the ``optuna`` logger that write to the terminal are pointed at
    rich's redirected stream, so that the sweep's own log lines scroll above the table instead of tearing it.
    """

    def __init__(self, *, console: object | None = None, max_rows: int = 20, refresh_per_second: float = 1.0) -> None:
        from rich.console import Console

        self.console = console if console is not None else Console(stderr=True)
        self.max_rows = max_rows
        self.refresh_per_second = refresh_per_second
        self.tracker = SweepTracker()
        self._lock = threading.Lock()
        self._live = None
        self._study_name = ""
        self._swapped: list[tuple[logging.StreamHandler, IO[str]]] = []

    def on_sweep_start(self, study: optuna.Study, devices: Sequence[str], started_at: float) -> None:
        from rich.live import Live

        with self._lock:
            self.tracker.sweep_start(devices, started_at)
        self._study_name = study.study_name
        self._live = Live(
            get_renderable=self.render,
            console=self.console,
            refresh_per_second=self.refresh_per_second,
            transient=False,
        )
        original = sys.stderr, sys.stdout
        self._live.start()
        refresher = getattr(self._live, "_refresh_thread", None)
        if refresher is not None:  # ours: the pool host may still be forked beside it (its locks are the console's,
            refresher.name = "saturn-progress"  # which the host never takes: its output goes to its log)
        self._redirect_logs(original)

    def on_plan(self, study: optuna.Study, plan: Plan, trial_numbers: Sequence[int], now: float) -> None:
        with self._lock:
            self.tracker.plan(plan, now)

    def on_profile(self, study: optuna.Study, event: ProfileEvent) -> None:
        if event.phase == "done":  # printed above the live table
            self.console.print(f"profiled {event.option} for trial {event.trial}: {event.summary}")

    def on_trial_start(self, study: optuna.Study, start: TrialStart) -> None:
        with self._lock:
            self.tracker.trial_start(start)

    def on_trial_progress(self, study: optuna.Study, progress: TrialProgress) -> None:
        with self._lock:
            self.tracker.trial_progress(progress)

    def on_trial_move(self, study: optuna.Study, move: TrialMove) -> None:
        self.console.print(describe_move(move))  # above the live table

    def on_trial_end(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, now: float) -> None:
        with self._lock:
            self.tracker.trial_end(trial, now)

    def on_sweep_end(self, study: optuna.Study, now: float, interrupted: bool) -> None:
        if self._live is not None:
            self._live.refresh()
            self._restore_logs()
            self._live.stop()
            self._live = None

    def on_workers_ready(self, study: optuna.Study, now: float) -> None:
        with self._lock:
            self.tracker.workers_ready_at = now

    def render(self) -> object:
        """The table as it is now (rich renderable); called by rich's refresh thread."""
        from rich.table import Table

        with self._lock:
            now = self.tracker.now()
            statuses = sorted(self.tracker.trials.values(), key=lambda s: (s.state in _FINISHED, s.number))
            counts = self.tracker.counts()
            sweep_left = self.tracker.sweep_remaining(now)
        active = [s for s in statuses if s.state not in _FINISHED]
        finished = sorted((s for s in statuses if s.state in _FINISHED), key=lambda s: -s.number)
        shown = (active + finished)[: self.max_rows]
        table = Table(title=f"optuna-saturn: study {self._study_name!r}", title_justify="left", expand=False)
        for column, justify in (
            ("trial", "right"),
            ("strategy", "left"),
            ("devices", "left"),
            ("state", "left"),
            ("step", "right"),
            ("elapsed", "right"),
            ("ETA", "right"),
            ("value", "right"),
        ):
            table.add_column(column, justify=justify)  # type: ignore[arg-type]
        styles = {"RUNNING": "bold blue", "COMPLETE": "green", "PRUNED": "yellow", "FAIL": "bold red"}
        for s in sorted(shown, key=lambda s: s.number):
            elapsed = None if s.start is None else (s.end if s.end is not None else now) - s.start
            step = f"{s.step}/{s.total}" if s.total else (str(s.step) if s.step else "")
            table.add_row(
                str(s.number),
                s.strategy,
                ", ".join(s.devices),
                f"[{styles.get(s.state, 'dim')}]{s.state}[/]",
                step,
                format_duration(elapsed),
                "" if s.state in _FINISHED else format_duration(s.remaining(now)),
                ", ".join(f"{v:.4g}" for v in s.values) if s.values and s.state == "COMPLETE" else "",
            )
        hidden = len(statuses) - len(shown)
        summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        starting = self.tracker.workers_ready_at is None
        table.caption = (
            f"elapsed {format_duration(now)} | "
            + ("starting the workers | " if starting else "")
            + f"sweep ETA {format_duration(sweep_left)} (trials planned so far) | {summary}"
            + (f" | {hidden} older rows hidden" if hidden else "")
        )
        table.caption_justify = "left"
        return table

    def _redirect_logs(self, original: tuple[IO[str], IO[str]]) -> None:
        for handler in logging.getLogger("optuna").handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream in original:
                target = sys.stderr if handler.stream is original[0] else sys.stdout
                self._swapped.append((handler, handler.setStream(target)))

    def _restore_logs(self) -> None:
        for handler, stream in self._swapped:
            handler.setStream(stream)
        self._swapped = []


def in_a_notebook() -> bool:
    """Whether this process is a Jupyter kernel (an IPython shell that is not a terminal)."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


class NotebookProgress(RichProgress):
    """The rich table of :class:`~optuna_saturn.progress.RichProgress`, rendered to HTML in the cell's output and
    refreshed in place every ``1 / refresh_per_second`` seconds; the sweep's log lines go where they went."""

    def __init__(self, *, max_rows: int = 20, refresh_per_second: float = 1.0, width: int = 110) -> None:
        from rich.console import Console

        super().__init__(
            console=Console(file=io.StringIO(), record=True, width=width, force_jupyter=False),
            max_rows=max_rows,
            refresh_per_second=refresh_per_second,
        )
        self._handle = None
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None

    def on_sweep_start(self, study: optuna.Study, devices: Sequence[str], started_at: float) -> None:
        from IPython.display import HTML, display

        with self._lock:
            self.tracker.sweep_start(devices, started_at)
        self._study_name = study.study_name
        self._handle = display(HTML(self._html()), display_id=True)
        self._stop.clear()
        self._refresher = threading.Thread(target=self._refresh_until_stopped, name="saturn-progress", daemon=True)
        self._refresher.start()

    def on_sweep_end(self, study: optuna.Study, now: float, interrupted: bool) -> None:
        self._stop.set()
        if self._refresher is not None:
            self._refresher.join()
            self._refresher = None
        self._update()  # the final table stays in the cell's output

    def on_profile(self, study: optuna.Study, event: object) -> None:
        if getattr(event, "phase", None) == "done":
            print(f"profiled {event.option} for trial {event.trial}: {event.summary}")  # type: ignore[attr-defined]

    def on_trial_move(self, study: optuna.Study, move: object) -> None:
        print(describe_move(move))  # type: ignore[arg-type]

    def _refresh_until_stopped(self) -> None:
        while not self._stop.wait(1.0 / self.refresh_per_second):
            self._update()

    def _update(self) -> None:
        from IPython.display import HTML

        if self._handle is not None:
            self._handle.update(HTML(self._html()))

    def _html(self) -> str:
        self.console.print(self.render())
        return self.console.export_html(inline_styles=True, clear=True)


def make_progress(mode: ProgressMode = "auto", *, stream: IO[str] | None = None) -> SweepListener:
    """The progress listener for ``mode``: ``"rich"`` (live table), ``"plain"`` (log lines), ``"quiet"``, or
    ``"auto"``: in a Jupyter notebook the live table in the cell's output, updated in place; else rich when
    ``stream`` (default stderr) is a terminal, plain otherwise."""
    if mode not in PROGRESS_MODES:
        raise ValueError(f"progress mode must be one of {PROGRESS_MODES}, got {mode!r}.")
    if mode == "quiet":
        return QuietProgress()
    target = stream or sys.stderr
    if mode == "auto" and stream is None and in_a_notebook():  # a live table in the cell's output, updated in place
        return NotebookProgress()
    if mode == "auto":
        mode = "rich" if getattr(target, "isatty", lambda: False)() else "plain"
    if mode == "rich":
        from rich.console import Console

        return RichProgress(console=Console(file=target))
    return PlainProgress(stream=stream)
