"""``SaturnExecutor.optimize``'s arguments, checked as ``study.optimize`` takes them: a wrong one is refused with
the fix before any process starts."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import optuna

from optuna_saturn.executor_arguments import is_number
from optuna_saturn.study.storage_checks import refuse_lost_guarantees


@dataclass(frozen=True)
class OptimizeArguments:
    """What the sweep runs with: ``n_jobs`` None for one trial per device."""

    catch: tuple[type[BaseException], ...]
    batch_size: int
    n_jobs: int | None
    show_progress_bar: bool


def checked(
    study: optuna.Study,
    *,
    devices: int,
    n_trials: int | None,
    timeout: float | None,
    batch_size: int | None,
    n_jobs: int | None,
    catch: Iterable[type[Exception]] | type[Exception],
    callbacks: Sequence[Callable[[optuna.Study, Any], None]] | None,
    show_progress_bar: bool,
) -> OptimizeArguments:
    """The arguments, or ``TypeError``/``ValueError`` naming the one that is wrong."""
    caught = (catch,) if isinstance(catch, type) else tuple(catch)
    for cls in caught:
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise TypeError(f"catch must be exception classes (as in study.optimize), got {cls!r}.")
    for callback in callbacks or ():
        if not callable(callback):
            raise TypeError(f"callbacks must be callables taking (study, frozen_trial), got {callback!r}.")
    if not isinstance(study, optuna.Study):
        raise TypeError(f"study must be an optuna.Study, got {type(study).__name__}.")
    refuse_lost_guarantees(study._storage)
    if n_trials is not None and (not isinstance(n_trials, int) or n_trials < 0):
        raise ValueError(f"n_trials must be a non-negative int or None, got {n_trials!r}.")
    if timeout is not None and not (is_number(timeout) and timeout > 0):  # (NaN compares False: refused too)
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}.")
    if n_jobs is not None and (isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or n_jobs < -1 or not n_jobs):
        raise ValueError(f"n_jobs must be None or -1 (one trial per device) or a positive int, got {n_jobs!r}.")
    if show_progress_bar and n_trials is None and timeout is not None and n_jobs not in (None, 1):
        # (Optuna's own rule, kept so that the caller sees what study.optimize shows)
        warnings.warn("The timeout-based progress bar is not supported with n_jobs != 1.", stacklevel=3)
        show_progress_bar = False
    batch = devices if batch_size is None else batch_size
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}.")
    return OptimizeArguments(caught, batch, None if n_jobs == -1 else n_jobs, bool(show_progress_bar))
