"""The user's sampler hears a trial's end as inside ``study.optimize``: what it raises reaches the caller, and a
``study.stop()`` it calls stops the sweep.

Optuna's ``study.tell`` calls ``sampler.after_trial``, writes the trial's end whatever it raised, then raises it.
The sweep's tell must not take that exception for the study refusing the result (which fails the trial and goes
on): it keeps it aside while telling, and raises it once the end is stored. Samplers also stop studies from
``after_trial`` (``GridSampler``, once its grid is done), which Optuna allows only inside ``optimize``: the tell
runs inside Optuna's optimize-loop flag, as ``study.optimize`` runs it, and the stop is reported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import optuna


@dataclass
class Heard:
    """What the sampler did while trials were told: the exceptions its ``after_trial`` raised, in order, and
    whether it stopped the study."""

    raised: list[Exception] = field(default_factory=list)
    stopped: bool = False


@contextlib.contextmanager
def as_in_optimize(study: optuna.Study) -> Iterator[Heard]:
    """While the block tells trials: the study's sampler's ``after_trial`` runs as inside ``study.optimize``."""
    sampler, local = study.sampler, study._thread_local
    original = sampler.after_trial
    heard = Heard()

    def after_trial(*args: object, **kwargs: object) -> None:
        try:
            original(*args, **kwargs)  # type: ignore[arg-type]  # (passed on as the study gave them)
        except Exception as exc:
            heard.raised.append(exc)
            raise

    had_own = "after_trial" in vars(sampler)
    was, local.in_optimize_loop, study._stop_flag = local.in_optimize_loop, True, False
    sampler.after_trial = after_trial  # type: ignore[method-assign]  # (this sampler object, while the block runs)
    try:
        yield heard
    finally:
        if had_own:
            sampler.after_trial = original  # type: ignore[method-assign]
        else:
            del sampler.after_trial
        local.in_optimize_loop = was
        heard.stopped = bool(study._stop_flag)
        study._stop_flag = False
