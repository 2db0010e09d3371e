"""What the effects act on: the sweep's state, its pool, its study (through the gateway and the queue), and its
prices. Built once per sweep (:mod:`optuna_saturn.sweep.assemble`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial

from optuna_saturn.clock import Clock
from optuna_saturn.events import Broadcast
from optuna_saturn.pools.protocol import Pool
from optuna_saturn.pricing.source import PriceSource
from optuna_saturn.study.gateway import StudyGateway
from optuna_saturn.study.ownership import Owner
from optuna_saturn.study.queue import StudyQueue
from optuna_saturn.sweep.options import OptionsView
from optuna_saturn.sweep.requests import JobRequests
from optuna_saturn.sweep.resumes import Resumes
from optuna_saturn.sweep.state import SweepState


@dataclass(frozen=True)
class World:
    state: SweepState
    clock: Clock
    pool: Pool
    gateway: StudyGateway
    queue: StudyQueue
    requests: JobRequests
    resumes: Resumes
    events: Broadcast
    owner: Owner
    prices: PriceSource | None  # None: trials are planned from runtime estimates alone
    view: OptionsView  # read only: the estimates an undescribed trial is priced by, and what pruning is assumed
    keep_checkpoints: bool
    callbacks: Sequence[Callable[[optuna.Study, FrozenTrial], None]] = ()
    gc_after_trial: bool = False

    def now(self) -> float:
        """Seconds since the sweep started, on its clock."""
        return self.clock.now() - self.state.started_at
