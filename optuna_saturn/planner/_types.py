"""The planner's data model: what a job may run as, where it runs, and the resulting plan.

These types are public API (see DESIGN.md, "Contracts"). They are plain frozen dataclasses so that a plan can be
built, compared and checked without any process, solver or Optuna object in sight.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Option:
    """One way to run a job: a parallelism strategy on a number of devices, taking ``runtime`` seconds in all.

    ``gradient_accumulation`` splits each device's share of a batch into that many micro-batches (the global
    batch stays the same): slower, but it fits where the whole batch would run out of memory.
    """

    strategy: str
    devices: int
    runtime: float
    gradient_accumulation: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.devices, int) or self.devices < 1:
            raise ValueError(f"Option.devices must be a positive int, got {self.devices!r}.")
        if not (isinstance(self.runtime, (int, float)) and math.isfinite(self.runtime) and self.runtime >= 0):
            raise ValueError(f"Option.runtime must be a finite number of seconds >= 0, got {self.runtime!r}.")
        accumulation = self.gradient_accumulation
        if not isinstance(accumulation, int) or isinstance(accumulation, bool) or accumulation < 1:
            raise ValueError(
                f"Option.gradient_accumulation must be a positive int, got {self.gradient_accumulation!r}."
            )

    @property
    def choice(self) -> tuple[str, int, int]:
        """What the option runs as, whatever its runtime: equal choices are the same option re-priced."""
        return (self.strategy, self.devices, self.gradient_accumulation)

    @property
    def label(self) -> str:
        """Short human name, e.g. ``fsdp ×4`` or ``single ×1 (4 micro-batches)``."""
        return option_label(self.strategy, self.devices, self.gradient_accumulation)

    @property
    def slug(self) -> str:
        """The name in file names and keys, e.g. ``fsdpx4`` or ``singlex1-accum4``."""
        return option_slug(self.strategy, self.devices, self.gradient_accumulation)

    def to_json(self) -> dict:
        data = {"strategy": self.strategy, "devices": self.devices, "runtime": round(self.runtime, 3)}
        if self.gradient_accumulation > 1:
            data["gradient_accumulation"] = self.gradient_accumulation
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Option:
        return cls(
            str(data["strategy"]),
            int(data["devices"]),
            float(data["runtime"]),
            int(data.get("gradient_accumulation", 1)),
        )


def option_label(strategy: str, devices: int, gradient_accumulation: int = 1) -> str:
    """How everything a person reads spells an option (logs, progress, reports, the table of ``profile``):
    ``fsdp ×4``, ``single ×1 (4 micro-batches)``."""
    return f"{strategy} ×{devices}" + (f" ({gradient_accumulation} micro-batches)" if gradient_accumulation > 1 else "")


def option_slug(strategy: str, devices: int, gradient_accumulation: int = 1) -> str:
    """How file names and keys spell an option, in plain characters: ``fsdpx4``, ``singlex1-accum4``."""
    return f"{strategy}x{devices}" + (f"-accum{gradient_accumulation}" if gradient_accumulation > 1 else "")


@dataclass(frozen=True)
class Job:
    """A trial to place: a unique name and the options it may run as (at least one)."""

    name: str
    options: Sequence[Option]

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", tuple(self.options))
        if not self.options:
            raise ValueError(f"Job {self.name!r} has no options; give it at least one Option.")


@dataclass(frozen=True)
class Cluster:
    """Devices per node, e.g. ``[8]`` or ``[8, 8, 4]``. A job always runs inside one node."""

    nodes: Sequence[int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if not self.nodes or any((not isinstance(n, int)) or n < 1 for n in self.nodes):
            raise ValueError(f"Cluster.nodes must be a non-empty list of positive ints, got {list(self.nodes)!r}.")

    @property
    def total_devices(self) -> int:
        return sum(self.nodes)


@dataclass(frozen=True)
class Assignment:
    """Where and when one job runs: its chosen option, node, concrete device indices in that node, start and end."""

    job: str
    option: Option
    node: int
    devices: tuple[int, ...]
    start: float
    end: float


@dataclass(frozen=True)
class Plan:
    """A schedule for every job. ``makespan`` is the latest end (0 for no jobs)."""

    assignments: tuple[Assignment, ...]
    solver: str = ""
    lower_bound: float = 0.0
    solve_seconds: float = 0.0
    optimal: bool = False
    info: dict = field(default_factory=dict, compare=False)

    @functools.cached_property
    def makespan(self) -> float:
        return max((a.end for a in self.assignments), default=0.0)

    def for_job(self, name: str) -> Assignment:
        for a in self.assignments:
            if a.job == name:
                return a
        raise KeyError(name)


@dataclass(frozen=True)
class Reservation:
    """Devices already taken when planning starts (a running trial): busy from time 0 until ``until`` seconds."""

    node: int
    devices: tuple[int, ...]
    until: float
    job: str = ""
