"""A sweep's parts, as :func:`~optuna_saturn.sweep.assemble.assemble` builds them for the loop."""

from __future__ import annotations

from dataclasses import dataclass

from optuna_saturn.clock import Clock
from optuna_saturn.pools.protocol import Pool
from optuna_saturn.sweep.asking import Asking
from optuna_saturn.sweep.effects import Effects
from optuna_saturn.sweep.elastic import Elastic
from optuna_saturn.sweep.faults import Faults
from optuna_saturn.sweep.options import OptionsView
from optuna_saturn.sweep.outcomes import Outcomes
from optuna_saturn.sweep.planning import Planning
from optuna_saturn.sweep.profiling import Profiling
from optuna_saturn.sweep.releasing import Releasing
from optuna_saturn.sweep.settings import SweepSettings
from optuna_saturn.sweep.state import SweepState


@dataclass(frozen=True)
class Parts:
    """A sweep's parts: the policies read ``state`` and return decisions, ``effects`` carry them out."""

    settings: SweepSettings
    pool: Pool
    clock: Clock
    called_back: bool  # Optuna callbacks are called after each trial's end
    state: SweepState
    effects: Effects
    view: OptionsView
    asking: Asking
    planning: Planning
    profiling: Profiling
    faults: Faults
    elastic: Elastic
    outcomes: Outcomes
    releasing: Releasing
