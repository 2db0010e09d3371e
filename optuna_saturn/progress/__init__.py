"""Live progress of a sweep: a rich table in a terminal or a notebook, plain log lines elsewhere, or nothing.

Why a listener: the sweep loop already reports plans, starts, step progress and ends
(:class:`~optuna_saturn.events.SweepListener`), so a display is only a view of those events. One tracker turns
them into per-trial and whole-sweep estimates; the views only format it. Use :func:`make_progress`.
"""

from __future__ import annotations

import sys
from typing import IO, Literal

from optuna_saturn.events import SweepListener
from optuna_saturn.progress.live import NotebookProgress, RichProgress, in_a_notebook
from optuna_saturn.progress.plain import PlainProgress, QuietProgress
from optuna_saturn.progress.tracker import SweepTracker, TrialStatus, describe_move, format_duration

__all__ = [
    "PROGRESS_MODES",
    "NotebookProgress",
    "PlainProgress",
    "ProgressMode",
    "QuietProgress",
    "RichProgress",
    "SweepTracker",
    "TrialStatus",
    "default_listeners",
    "describe_move",
    "format_duration",
    "in_a_notebook",
    "make_progress",
]

ProgressMode = Literal["auto", "rich", "plain", "quiet"]
PROGRESS_MODES: tuple[str, ...] = ("auto", "rich", "plain", "quiet")


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


def default_listeners(progress: ProgressMode | None, dashboard: bool | None) -> list[SweepListener]:
    """What a sweep shows: the progress display for ``progress`` (None: none), and the schedule chart in
    optuna-dashboard unless ``dashboard`` is False (None: where optuna-dashboard is installed; True: it must be)."""
    listeners: list[SweepListener] = []
    if progress is not None:
        listeners.append(make_progress(progress))
    if dashboard is not False:
        try:
            from optuna_saturn.report import DashboardPublisher

            listeners.append(DashboardPublisher())
        except ImportError:
            if dashboard:
                raise
    return listeners
