"""Where a sweep's prices come from: the one interface the sweep reads trials' options through.

Two sources implement it: :class:`~optuna_saturn.pricing.pricer.Pricer` (a real sweep: trials described by
running their objective up to its loop, options measured by profiling jobs or predicted) and
:class:`~optuna_saturn.simulation.known_prices.KnownPrices` (a simulation: the workload's runtimes are given). A new
source (prices shared by a team's profile service, say) implements this and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import optuna

from optuna_saturn.planner import Option
from optuna_saturn.pricing.prices import ProfileEntry, ProfileJob, TrialPrice
from optuna_saturn.profiler import ProfileRecord, Workload
from optuna_saturn.strategy import Strategy

#: What a profiling job measured: per entry and strategy, its record (None: not reached).
Recorded = list[tuple[ProfileEntry, Strategy, ProfileRecord | None]]


class PriceSource(Protocol):
    """What the sweep asks of its prices. Called from the sweep loop's thread only."""

    def workload(self, number: int) -> Workload | None:
        """Trial ``number``'s workload, if it was described (None: planned from runtime estimates)."""

    def forget(self, number: int) -> None:
        """Trial ``number`` was priced as a stand-in the study never saw: a later trial of that number is new."""

    @property
    def prepares_nothing(self) -> bool:
        """The objective, described, prepared nothing for a strategy to choose: its trials run as they are."""

    def price(self, trial: Any) -> TrialPrice:
        """Every option the trial may run as, measured or predicted (describing it first if it is new). ``trial``
        is an ``optuna.Trial``, or a trial still in the study's queue (its parameters fixed)."""

    def profile_jobs(
        self, wanted: Sequence[tuple[optuna.Trial | optuna.trial.FixedTrial, tuple[str, int, int]]]
    ) -> list[ProfileJob]:
        """The options to measure (trial, option choice), grouped into profiling jobs."""

    def record(
        self, job: ProfileJob, results: dict[int, list[dict]], started_at: float, unreported: dict | None = None
    ) -> Recorded:
        """Keep what a profiling job measured (``results``: per trial, its ranks' reports)."""

    def follow_ups(self, job: ProfileJob, recorded: Recorded) -> list[ProfileJob]:
        """The jobs that measure what ``job`` did not reach."""

    def learn_from_run(
        self,
        number: int,
        option: Option,
        *,
        step_seconds: float,
        steps: int,
        startup_seconds: float | None,
        tail_seconds: float | None,
        loop_steps: list[int],
        early: bool = False,
    ) -> bool:
        """A trial's real run under ``option`` as that option's profile (its lesson: the steps' rate and count,
        the start-up before them, the objective after them, its loops); whether any price changes."""

    def mark_failed(self, number: int, option: Option, error: str) -> None:
        """A run under ``option`` crashed in a way the option may be at fault: never planned for the workload."""

    def mark_out_of_memory(self, number: int, option: Option, error: str) -> None:
        """A run under ``option`` ran out of memory: infeasible for the workload (more micro-batches may fit)."""
