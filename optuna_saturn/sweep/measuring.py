"""How long measuring takes: a profiling job's predicted length (the loop holds its devices for it) and one
option's measurement (what the profiling policy weighs against what the measurement may save)."""

from __future__ import annotations

from optuna_saturn.pricing.prices import PricedOption
from optuna_saturn.sweep.state import ProfileRun, SweepState, Waiting

#: Seconds a measurement of one option spends beyond its steps: starting it on its devices.
SETUP_SECONDS = 1.0
#: A profiling job's option whose trial no longer waits (it started meanwhile) is taken to be this long.
UNKNOWN_RUNTIME = 10.0


class MeasuringTimes:
    """``profile_steps``: the warm-up and timed steps of a measurement."""

    def __init__(self, profile_steps: tuple[int, int]) -> None:
        self._profile_steps = profile_steps

    def profile_seconds(self, run: ProfileRun, state: SweepState) -> float:
        """A profiling job's predicted length: per trial and strategy, its set-up and warm-up and timed steps."""
        total = 0.0
        for entry in run.job.entries:
            waiting = state.waiting.get(entry.trial.number)
            for strategy in entry.strategies:
                choice = (strategy.name, run.job.devices, run.job.gradient_accumulation)
                priced = waiting.price.option(choice) if waiting is not None else None
                runtime = priced.option.runtime if priced is not None else UNKNOWN_RUNTIME
                total += self._seconds(runtime, entry.workload.total_steps)
        return total

    def measurement_seconds(self, waiting: Waiting, priced: PricedOption) -> float:
        """How long measuring one option of a waiting trial takes: its set-up and its warm-up and timed steps."""
        workload = waiting.price.workload
        return self._seconds(priced.option.runtime, workload.total_steps if workload is not None else 1)

    def _seconds(self, runtime: float, total_steps: int) -> float:
        """An option of ``runtime`` for ``total_steps`` steps, measured over the profile's steps."""
        return runtime / max(total_steps, 1) * sum(self._profile_steps) + SETUP_SECONDS
