"""Runtime estimates that the planner works from, corrected by what the sweep observes.

Until the profiler measures a trial, its options are priced by a scaling prior: near-linear speed-up with a 10%
loss per doubling of devices. Every trial that completes replaces guesswork with a measurement for its
(strategy, device count); other options are rescaled from the nearest measurement through the prior's ratios.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Sequence

from optuna_saturn.planner import Option
from optuna_saturn.pricing.prices import PricedOption
from optuna_saturn.strategy import Strategy

NOMINAL_TRIAL_SECONDS = 60.0
SCALING_EFFICIENCY_PER_DOUBLING = 0.9


def prior_speedup(devices: int) -> float:
    speedup: float = devices * SCALING_EFFICIENCY_PER_DOUBLING ** math.log2(
        devices
    )  # (typeshed: float ** float is Any)
    return speedup


class RuntimeEstimator:
    """Whole-trial runtime per option choice (strategy, device count, micro-batches), from observations where
    there are any."""

    def __init__(self, strategies: Sequence[Strategy], pool_size: int) -> None:
        # Unprofiled options use the fewest micro-batches a strategy allows (no evidence that more are needed).
        self._choices = [(s.name, n, s.accumulation_factors[0]) for s in strategies for n in s.device_counts(pool_size)]
        self._observed: dict[tuple[str, int, int], list[float]] = defaultdict(list)
        self._ratios: list[float] = []  # sorted
        self._median_ratio = 1.0
        self.version = 0  # changes whenever corrected() may answer otherwise

    def observe(self, option: Option, seconds: float) -> None:
        self._observed[option.choice].append(seconds)

    def observe_step_rate(self, profiled: float | None, actual: float) -> None:
        """A trial planned from a profile finished: remember how its loop's real seconds per step (evaluation
        passes and checkpoints inside the loop included) compare with the profile's timed steps (None: it timed
        none, an infeasible one)."""
        if profiled is not None and profiled > 0 and actual > 0:
            bisect.insort(self._ratios, actual / profiled)
            middle = len(self._ratios) // 2
            median = (
                self._ratios[middle] if len(self._ratios) % 2 else (self._ratios[middle - 1] + self._ratios[middle]) / 2
            )
            if median != self._median_ratio:  # (a large sweep re-prices every waiting trial when it changes)
                self._median_ratio = median
                self.version += 1

    def corrected(self, predicted: float, loop_seconds: float) -> float:
        """A profile-based runtime whose training loop (``loop_seconds`` of it) runs at the median real / profiled
        step rate seen so far in this sweep. Start-up and the time after the loop are measured as they are."""
        return predicted + (self._median_ratio - 1.0) * loop_seconds

    def estimate(self, strategy: str, devices: int, gradient_accumulation: int = 1) -> float:
        own = self._observed.get((strategy, devices, gradient_accumulation))
        if own:
            return sum(own) / len(own)
        single_device_equivalents = [sum(v) / len(v) * prior_speedup(n) for (_, n, _), v in self._observed.items() if v]
        base = (
            sum(single_device_equivalents) / len(single_device_equivalents)
            if single_device_equivalents
            else NOMINAL_TRIAL_SECONDS
        )
        return base / prior_speedup(devices)

    def options(self) -> list[Option]:
        return [
            Option(strategy, n, self.estimate(strategy, n, accumulation), accumulation)
            for strategy, n, accumulation in self._choices
        ]

    def priced(self, *, as_is: bool = False) -> list[PricedOption]:
        """Every option priced by these estimates alone: a trial that cannot be described (or a sweep with no
        profile store) is planned with them. ``as_is``: its objective prepares nothing for a strategy, so only
        one device's plainest option (``single`` where offered): more devices would run the same objective on
        each, for nothing."""
        options = self.options()
        if as_is:
            one = [o for o in options if o.devices == 1]
            options = [o for o in one if o.strategy == "single"] or one[:1] or options
        return [PricedOption(o, "", None, 1.0, "estimate") for o in options]
