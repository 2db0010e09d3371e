"""Progress as a live rich table: in a terminal, or in a notebook cell's output, updated in place."""

from __future__ import annotations

import io
import logging
import sys
import threading
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

import optuna

from optuna_saturn.events import ProfileEvent, SweepListener, TrialMove, TrialProgress, TrialStart
from optuna_saturn.planner import Plan
from optuna_saturn.progress.tracker import FINISHED, SweepTracker, describe_move, format_duration

if TYPE_CHECKING:  # (rich is imported when a table is shown: the dashboard extra)
    from rich.console import Console, JustifyMethod
    from rich.live import Live
    from rich.table import Table


class RichProgress(SweepListener):
    """A live table: per trial strategy, devices, state, step, elapsed time and ETA; below it, the sweep's ETA.

    While the table is shown, log handlers of the ``optuna`` logger that write to the terminal are pointed at
    rich's redirected stream, so that the sweep's own log lines scroll above the table instead of tearing it.
    """

    def __init__(self, *, console: Console | None = None, max_rows: int = 20, refresh_per_second: float = 1.0) -> None:
        from rich.console import Console

        self.console = console if console is not None else Console(stderr=True)
        self.max_rows = max_rows
        self.refresh_per_second = refresh_per_second
        self.tracker = SweepTracker()
        self._lock = threading.Lock()
        self._live: Live | None = None
        self._study_name = ""
        self._swapped: list[tuple[logging.StreamHandler, IO[str]]] = []

    def on_sweep_start(self, study: optuna.Study, devices: Sequence[str], started_at: float) -> None:
        from rich.live import Live

        with self._lock:
            self.tracker.sweep_start(devices, started_at)
        self._study_name = study.study_name
        live = self._live = Live(
            get_renderable=self.render,
            console=self.console,
            refresh_per_second=self.refresh_per_second,
            transient=False,
        )
        original = sys.stderr, sys.stdout
        live.start()
        refresher = getattr(live, "_refresh_thread", None)
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

    def render(self) -> Table:
        """The table as it is now (rich renderable); called by rich's refresh thread."""
        from rich.table import Table

        with self._lock:
            now = self.tracker.now()
            statuses = sorted(self.tracker.trials.values(), key=lambda s: (s.state in FINISHED, s.number))
            counts = self.tracker.counts()
            sweep_left = self.tracker.sweep_remaining(now)
        active = [s for s in statuses if s.state not in FINISHED]
        finished = sorted((s for s in statuses if s.state in FINISHED), key=lambda s: -s.number)
        shown = (active + finished)[: self.max_rows]
        table = Table(title=f"optuna-saturn: study {self._study_name!r}", title_justify="left", expand=False)
        columns: tuple[tuple[str, JustifyMethod], ...] = (
            ("trial", "right"),
            ("strategy", "left"),
            ("devices", "left"),
            ("state", "left"),
            ("step", "right"),
            ("elapsed", "right"),
            ("ETA", "right"),
            ("value", "right"),
        )
        for column, justify in columns:
            table.add_column(column, justify=justify)
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
                "" if s.state in FINISHED else format_duration(s.remaining(now)),
                ", ".join(f"{v:.4g}" for v in s.values) if s.values and s.state == "COMPLETE" else "",
            )
        hidden = len(statuses) - len(shown)
        summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        starting = self.tracker.workers_ready_at is None
        table.caption = (
            f"elapsed {format_duration(now)} | "
            + ("starting the workers | " if starting else "")
            + f"the trials planned so far end in {format_duration(sweep_left)} | {summary}"
            + (f" | {hidden} older rows hidden" if hidden else "")
        )
        table.caption_justify = "left"
        return table

    def _redirect_logs(self, original: tuple[IO[str], IO[str]]) -> None:
        for handler in logging.getLogger("optuna").handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream in original:
                target = sys.stderr if handler.stream is original[0] else sys.stdout
                previous = handler.setStream(target)
                if previous is not None:  # (None: rich did not redirect it, off a terminal; nothing to put back)
                    self._swapped.append((handler, previous))

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
        self._handle: Any = None  # (IPython's DisplayHandle, once the table is shown)
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

    def on_profile(self, study: optuna.Study, event: ProfileEvent) -> None:
        if getattr(event, "phase", None) == "done":
            print(f"profiled {event.option} for trial {event.trial}: {event.summary}")

    def on_trial_move(self, study: optuna.Study, move: TrialMove) -> None:
        print(describe_move(move))

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
