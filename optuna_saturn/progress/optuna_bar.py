"""``optimize(show_progress_bar=True)``: Optuna's own progress bar, as ``study.optimize`` draws it."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.progress_bar import _ProgressBar

from optuna_saturn.events import SweepListener


class OptunaProgressBar(SweepListener):
    """Optuna's tqdm bar (best trial, best value, trials done or seconds of ``timeout`` spent), moved on as each
    trial ends. Optuna keeps the class private; drawing it here is what keeps the caller's habit working, where a
    bar of our own would differ from the one their logs and tests know."""

    def __init__(self, n_trials: int | None, timeout: float | None) -> None:
        self._bar = _ProgressBar(True, n_trials, timeout)

    def on_trial_end(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, now: float) -> None:
        self._bar.update(now, study)

    def on_sweep_end(self, study: optuna.Study, now: float, interrupted: bool) -> None:
        self._bar.close()
        _stop_the_monitor(getattr(self._bar, "_progress_bar", None))


def _stop_the_monitor(bar: Any) -> None:
    """tqdm leaves a monitor thread (``tqdm_monitor``) behind its last bar. A process with a thread of its own
    cannot be forked safely, so the next sweep's pool would start fresh interpreters: once no bar is left, it
    is stopped (tqdm starts another with the next bar)."""
    cls = type(bar)
    monitor = getattr(cls, "monitor", None)
    if bar is None or monitor is None or getattr(cls, "_instances", None):
        return
    monitor.exit()
    cls.monitor = None
