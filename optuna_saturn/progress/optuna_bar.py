"""``optimize(show_progress_bar=True)``: Optuna's own progress bar, as ``study.optimize`` draws it."""

from __future__ import annotations

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
