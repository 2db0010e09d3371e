"""A floor under predicted runtimes: no option may be predicted faster than linear scaling of what was measured
for the same trial allows. Pure functions of a trial's priced options."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from optuna_saturn.pricing.prices import PricedOption
from optuna_saturn.strategy import Strategy


def no_better_than_linear_scaling(
    options: Sequence[PricedOption], strategies: Mapping[str, Strategy]
) -> list[PricedOption]:
    """Predicted options raised to what linear scaling of this trial's measured ones allows: ``k`` devices at best
    divide the device-seconds of the same training by ``k``. A cost model extrapolating from a few small workloads
    can predict more (2.6x on 2 devices was seen, which the plan then chose and lost time on); the floor is taken
    only from strategies that compute plainly (no recomputation, no offload), which memory savings cannot beat."""
    plain = [
        p.option.runtime * p.option.devices
        for p in options
        if p.measured and computes_plainly(strategies[p.option.strategy])
    ]
    if not plain:
        return list(options)
    least = min(plain)
    return [
        p
        if p.measured or p.option.runtime * p.option.devices >= least
        else replace(p, option=replace(p.option, runtime=least / p.option.devices), basis=f"{p.basis}, floored")
        for p in options
    ]


def computes_plainly(strategy: Strategy) -> bool:
    """Whether the strategy does the step's compute with nothing traded for memory (activation recomputation,
    offload to CPU), so that no other strategy's step can beat it by more than its device count."""
    return not strategy.engine_traits.trades_compute_for_memory(strategy.knobs, strategy.launcher_config)
