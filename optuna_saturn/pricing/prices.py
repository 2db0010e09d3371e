"""A trial's options as the sweep knows them: each with its best runtime estimate, measured or predicted, and the
profiling jobs that measure them. Plain data, shared by every source of prices (the pricer of real sweeps, the
known prices of a simulated one)."""

from __future__ import annotations

from dataclasses import dataclass, field

import optuna

from optuna_saturn.planner import Option
from optuna_saturn.planner._types import option_slug
from optuna_saturn.profiler import DescribeFailed, ProfileRecord, Workload
from optuna_saturn.strategy import Strategy


@dataclass(frozen=True)
class ProfileEntry:
    """One trial's part of a profiling job: its objective timed under each of ``strategies`` in turn."""

    trial: optuna.Trial | optuna.trial.FixedTrial  # (a FixedTrial: one still in the study's queue)
    workload: Workload
    strategies: tuple[Strategy, ...]
    keys: tuple[str, ...]


@dataclass(frozen=True)
class ProfileJob:
    """A short timed run on ``devices`` devices with ``gradient_accumulation`` micro-batches: one or several
    trials, each under one or several strategies, one after another (the job's set-up is paid once)."""

    entries: tuple[ProfileEntry, ...]
    devices: int
    gradient_accumulation: int = 1

    @property
    def name(self) -> str:
        strategies = "+".join(dict.fromkeys(s.name for e in self.entries for s in e.strategies))
        trials = ",".join(str(e.trial.number) for e in self.entries)
        return f"{trials}-{option_slug(strategies, self.devices, self.gradient_accumulation)}"


@dataclass(frozen=True)
class PricedOption:
    """An option of a trial with its best runtime estimate: measured (``record``) or predicted."""

    option: Option
    key: str
    record: ProfileRecord | None = None
    uncertainty: float = 0.0  # relative, 0 when measured
    basis: str = "measured"

    @property
    def measured(self) -> bool:
        return self.record is not None


@dataclass
class TrialPrice:
    """Every option a trial may run as, and the profiles behind them (for its user attributes)."""

    workload: Workload | None
    options: list[PricedOption] = field(default_factory=list)
    profiles: list[dict] = field(default_factory=list)
    failure: str | None = None  # why the trial fails without a run (its objective exited while described)
    raised: dict | None = None  # the exception its objective raised then (optuna_saturn.raised), if it raised one

    def option(self, choice: tuple[str, int, int]) -> PricedOption | None:
        return next((p for p in self.options if p.option.choice == choice), None)

    @classmethod
    def undescribed(cls, exited: DescribeFailed | None) -> TrialPrice:
        """The price of a trial that could not be described: none yet (it is planned from estimates), or, where
        its objective ``exited`` (or was killed) while described, a failure."""
        if exited is None:
            return cls(None)
        return cls(None, failure=str(exited), raised=exited.raised)


def summary(record: ProfileRecord) -> dict:
    """A profile as a trial's user attributes show it."""
    out = {
        "strategy": record.strategy,
        "devices": record.devices,
        "feasible": record.feasible,
        "step_seconds": record.step_seconds,
        "startup_seconds": record.startup_seconds,
        "tail_seconds": record.tail_seconds,
        "exit_seconds": record.exit_seconds,
        "observed_step_seconds": record.observed_step_seconds,
        "peak_memory_bytes": record.peak_memory_bytes,
        "key": record.key,
    }
    if record.gradient_accumulation > 1:
        out["gradient_accumulation"] = record.gradient_accumulation
    if not record.feasible:
        out["error"] = record.error
    if record.failed:
        out["failed"] = True
    if record.near_capacity:
        out["near_capacity"] = True
    if len(record.loop_steps) > 1:
        out["loops"] = len(record.loop_steps)
        out["between_seconds"] = record.between_seconds
    return out
