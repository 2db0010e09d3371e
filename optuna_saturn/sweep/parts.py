"""A sweep's parts, as :func:`~optuna_saturn.sweep.assemble.assemble` builds them for the loop."""

from __future__ import annotations

from dataclasses import dataclass

from optuna_saturn.clock import Clock
from optuna_saturn.pools.protocol import Pool
from optuna_saturn.sweep.asking import Asking
from optuna_saturn.sweep.effects import Effects
from optuna_saturn.sweep.options import OptionsView
from optuna_saturn.sweep.planning import Planning
from optuna_saturn.sweep.policy import Policy
from optuna_saturn.sweep.profiling import Profiling
from optuna_saturn.sweep.settings import SweepSettings
from optuna_saturn.sweep.state import SweepState


@dataclass(frozen=True)
class Parts:
    """A sweep's parts: the policies read ``state`` and return decisions, ``effects`` carry them out. ``policies``
    is every rule, in the order the loop calls their hooks; ``asking``, ``planning`` and ``profiling`` are among
    them, and also answer the loop directly (when to take a trial in, when and what to plan, what it spent)."""

    settings: SweepSettings
    pool: Pool
    clock: Clock
    called_back: bool  # Optuna callbacks are called after each trial's end
    state: SweepState
    effects: Effects
    view: OptionsView
    policies: tuple[Policy, ...]
    asking: Asking
    planning: Planning
    profiling: Profiling
