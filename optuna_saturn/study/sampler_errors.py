"""What the user's sampler raises when it hears a trial's end reaches the caller, as in ``study.optimize``.

Optuna's ``study.tell`` calls ``sampler.after_trial``, writes the trial's end whatever it raised, then raises it.
The sweep's tell must not take that exception for the study refusing the result (which fails the trial and goes
on): it keeps it aside while telling, and raises it once the end is stored.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import optuna


@contextlib.contextmanager
def sampler_errors_kept(study: optuna.Study) -> Iterator[list[Exception]]:
    """While the block tells trials: what the study's sampler's ``after_trial`` raised, in order."""
    sampler = study.sampler
    original = sampler.after_trial
    raised: list[Exception] = []

    def after_trial(*args: object, **kwargs: object) -> None:
        try:
            original(*args, **kwargs)  # type: ignore[arg-type]  # (passed on as the study gave them)
        except Exception as exc:
            raised.append(exc)
            raise

    had_own = "after_trial" in vars(sampler)
    sampler.after_trial = after_trial  # type: ignore[method-assign]  # (this sampler object, while the block runs)
    try:
        yield raised
    finally:
        if had_own:
            sampler.after_trial = original  # type: ignore[method-assign]
        else:
            del sampler.after_trial
