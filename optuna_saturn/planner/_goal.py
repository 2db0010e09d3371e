"""What a plan is best at: the planner's goal (DESIGN.md decision 17). ("Objective", in this package, is the user's
Optuna objective function; the planner's is its goal.)

- :class:`Makespan` (the default): the earliest end.
- :class:`Deadline`: every job ends by ``seconds`` (times are the plan's: from now, after what is ``busy``), at
  the fewest device-seconds. Efficient options win where the deadline allows them: a trial on 8 devices that runs
  5x faster than on 1 spends 1.6x the device-seconds, a cost the deadline may not need. Where no plan meets it, the
  plan is the earliest-ending one, and says so (``plan.info["met"]`` is False).
- :class:`Budget`: the earliest end whose device-seconds stay within ``device_seconds``; where none does, the plan
  with the fewest device-seconds, which says so.

A plan's device-seconds are what its jobs hold devices for: ``devices x runtime`` summed over its assignments. A
pool that can give idle devices back (a cloud or Ray cluster that scales down) pays only those; a fixed pool pays
for its devices whether they run or idle, and there a deadline saves no money, only energy and others' waiting.
With a ``price_per_device_hour``, a plan reports its cost too.

A new goal subclasses :class:`Goal`: the solvers take its model part from :meth:`Goal.shape` and the sweep asks
it the questions below; none of them reads its fields.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Protocol

from optuna_saturn.planner._duration import parse_duration
from optuna_saturn.planner._types import Assignment, Plan

_TOL = 1e-6

__all__ = ["Budget", "Deadline", "DeadlineUnreachable", "Goal", "GoalModel", "Makespan", "device_seconds", "goal_of"]


def device_seconds(assignments: Iterable[Assignment]) -> float:
    """The device-seconds that ``assignments`` hold devices for."""
    return sum(a.option.devices * (a.end - a.start) for a in assignments)


class GoalModel(Protocol):
    """The part of an exact solver's model (the MILP's, CP-SAT's) that a goal shapes: the plan's end (the latest
    job's end, seconds) and its device-seconds, each of which can be bounded or minimised. A solver that takes a
    goal implements these four; the goal calls the ones it needs, so a new goal edits no solver. (No tie-break on
    the end where the device-seconds are minimised: one, of 0.01 device-seconds per second, ended the simulated
    sweeps of ``benchmarks/deadlines.py`` earlier but spent more device-hours in one of them.)"""

    def limit_end(self, seconds: float) -> None: ...

    def limit_spent(self, device_seconds: float) -> None: ...

    def minimise_end(self) -> None: ...

    def minimise_spent(self) -> None: ...


def _positive(value: Any, what: str, unit: str) -> float:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value > 0):
        raise ValueError(f"{what} must be a positive finite number of {unit}, got {value!r}.")
    return float(value)


@dataclass(frozen=True)
class Goal(abc.ABC):
    """What the planner's plans are best at (see the module's docstring). ``price_per_device_hour`` only adds
    costs to the reports."""

    price_per_device_hour: float = field(default=0.0, kw_only=True)

    #: The goal's name in reports and messages.
    name: ClassVar[str] = "goal"
    #: Whether plans are for the earliest end alone: then a plan that follows the previous one may be kept, elastic
    #: moves serve it, and there is no constraint to report.
    earliest_end: ClassVar[bool] = False
    #: Whether a sweep's first plan (and, before the first trial is asked, a preview of it) that misses the goal
    #: refuses the sweep: a later end is no use to one whose time is fixed.
    refuses_first_miss: ClassVar[bool] = False
    #: Whether a plan that meets the goal is tried on fewer nodes (those idle to its end go back).
    packs_nodes: ClassVar[bool] = False

    def __post_init__(self) -> None:
        price = self.price_per_device_hour
        if not (isinstance(price, (int, float)) and math.isfinite(price) and price >= 0):
            raise ValueError(f"price_per_device_hour must be >= 0, got {price!r}.")

    @property
    def whole_sweep(self) -> bool:
        """Whether the goal bounds the whole sweep (its end or its spend), not only the next plan: then plans count
        the trials to come, workers that come up are planned on at once, and idle nodes are given back."""
        return not self.earliest_end

    @abc.abstractmethod
    def key(self, makespan: float, spent: float) -> tuple[float, float]:
        """What to minimise, in order: first how far the plan breaks the goal's constraint (0 where it holds), then
        the measure the goal minimises."""

    @abc.abstractmethod
    def shape(self, model: GoalModel) -> None:
        """Bound and minimise what the goal asks of an exact solver's ``model`` (a hard constraint: a model that
        cannot meet it finds nothing, and the heuristics' plan stands)."""

    @abc.abstractmethod
    def violation(self, end: float, spent: float) -> str:
        """How a plan ending at ``end`` after ``spent`` device-seconds breaks the goal's constraint ("" where it
        holds, to a relative tolerance of 1e-6). The validator calls it with what it counted itself."""

    @abc.abstractmethod
    def shifted(self, *, elapsed: float = 0.0, spent: float = 0.0) -> Goal:
        """The same goal for a plan made ``elapsed`` seconds later, after ``spent`` device-seconds (a sweep's
        re-plan: its deadline comes closer, its budget shrinks). A constraint already passed keeps a sliver, so that
        the plan is the earliest or cheapest one and says it misses."""

    def seconds_left(self, now: float) -> float:
        """The seconds from ``now`` to the time the goal ends the sweep by (0 where it fixes none)."""
        return 0.0

    def latest_end(self, makespan: float, *, cheapest_end: float = 0.0) -> float:
        """How late a plan may end and still serve the goal, given one that ends at ``makespan``: how far the
        solvers' search reaches. ``cheapest_end`` is where the plan that spends least ends with its jobs run one
        after another once every busy device is free (0 where unknown)."""
        return makespan

    def missed(self, *, earliest_end: float, least_spent: float, now_seen: Goal) -> str:
        """Why no plan meets it: the earliest end any plan reaches, or the device-seconds the cheapest plan of the
        trials left spends against what is left (``now_seen``: the goal as the plan saw it)."""
        return ""

    def misses(self, plan: Plan, earliest_end: float) -> bool:
        """Whether the sweep planned by ``plan``, its trials to come included, ending at ``earliest_end`` at the
        earliest, misses the goal."""
        return not plan.info.get("met", True)

    def summary(self) -> dict[str, Any]:
        """What a sweep's summary says it planned for."""
        return {"kind": self.name}

    def size_key(self, devices: int, wall: float, device_hours: float) -> tuple[float, ...]:
        """How pool sizes that meet the goal are ranked (``optuna-saturn simulate --deadline/--budget``)."""
        return (wall, devices)

    @property
    def size_question(self) -> str:
        """What that ranking answers."""
        return f"The best pool for the {self.name}"

    def plan_key(self, assignments: Iterable[Assignment]) -> tuple[float, float]:
        placed = list(assignments)
        return self.key(max((a.end for a in placed), default=0.0), device_seconds(placed))

    def problems(self, plan: Plan) -> list[str]:
        """How ``plan`` breaks this goal's constraint (empty when it holds, and always for the makespan)."""
        why = self.violation(plan.makespan, device_seconds(plan.assignments))
        return [why] if why else []

    def report(self, plan: Plan) -> dict:
        """What ``plan.info`` says of it under this goal: its device-seconds and cost, whether it meets the goal's
        constraint."""
        spent = device_seconds(plan.assignments)
        out: dict = {"objective": self.name, "device_seconds": round(spent, 3), "met": not self.problems(plan)}
        if self.price_per_device_hour:
            out["cost"] = round(spent / 3600 * self.price_per_device_hour, 2)
        return out


def _over(value: float, limit: float) -> bool:
    return value > limit + _TOL * max(1.0, limit)


@dataclass(frozen=True)
class Makespan(Goal):
    """The earliest end (the default)."""

    name = "makespan"
    earliest_end = True

    def key(self, makespan: float, spent: float) -> tuple[float, float]:
        return (makespan, spent)

    def shape(self, model: GoalModel) -> None:
        model.minimise_end()

    def violation(self, end: float, spent: float) -> str:
        return ""

    def shifted(self, *, elapsed: float = 0.0, spent: float = 0.0) -> Goal:
        return self


@dataclass(frozen=True)
class Deadline(Goal):
    """Every job ends by ``seconds`` (a number, or a duration such as ``"8h"``), at the fewest device-seconds."""

    seconds: float

    name = "deadline"
    refuses_first_miss = True
    packs_nodes = True

    def __post_init__(self) -> None:
        super().__post_init__()
        seconds = parse_duration(self.seconds) if isinstance(self.seconds, str) else self.seconds
        object.__setattr__(self, "seconds", _positive(seconds, "Deadline.seconds", "seconds"))

    def key(self, makespan: float, spent: float) -> tuple[float, float]:
        return (max(0.0, makespan - self.seconds), spent)

    def shape(self, model: GoalModel) -> None:
        model.limit_end(self.seconds)
        model.minimise_spent()

    def violation(self, end: float, spent: float) -> str:
        if _over(end, self.seconds):
            return f"the plan ends at {end:.1f} s, past its deadline of {self.seconds:.1f} s."
        return ""

    def shifted(self, *, elapsed: float = 0.0, spent: float = 0.0) -> Goal:
        return replace(self, seconds=max(self.seconds - elapsed, _TOL))

    def seconds_left(self, now: float) -> float:
        return max(0.0, self.seconds - now)

    def latest_end(self, makespan: float, *, cheapest_end: float = 0.0) -> float:
        return max(makespan, self.seconds)

    def missed(self, *, earliest_end: float, least_spent: float, now_seen: Goal) -> str:
        return f"no plan ends by the deadline of {self.seconds:.0f} s: the earliest end is {earliest_end:.0f} s"

    def misses(self, plan: Plan, earliest_end: float) -> bool:
        return earliest_end > self.seconds

    def summary(self) -> dict[str, Any]:
        return {"kind": self.name, "deadline": self.seconds, "budget_hours": None}

    def size_key(self, devices: int, wall: float, device_hours: float) -> tuple[float, ...]:
        return (devices, device_hours)

    @property
    def size_question(self) -> str:
        return "The fewest devices that meet the deadline"


@dataclass(frozen=True)
class Budget(Goal):
    """The earliest end within ``device_seconds`` (devices x seconds they are held; the executor's and the command
    line's ``budget`` is in device-HOURS: :func:`goal_of` converts)."""

    device_seconds: float

    name = "budget"

    def __post_init__(self) -> None:
        super().__post_init__()
        value = _positive(self.device_seconds, "Budget.device_seconds", "device-seconds")
        object.__setattr__(self, "device_seconds", value)

    def key(self, makespan: float, spent: float) -> tuple[float, float]:
        return (max(0.0, spent - self.device_seconds), makespan)

    def shape(self, model: GoalModel) -> None:
        model.limit_spent(self.device_seconds)
        model.minimise_end()

    def violation(self, end: float, spent: float) -> str:
        if _over(spent, self.device_seconds):
            return f"the plan spends {spent:.1f} device-seconds, over its budget of {self.device_seconds:.1f}."
        return ""

    def shifted(self, *, elapsed: float = 0.0, spent: float = 0.0) -> Goal:
        return replace(self, device_seconds=max(self.device_seconds - spent, _TOL))

    def latest_end(self, makespan: float, *, cheapest_end: float = 0.0) -> float:
        # A plan over budget is no use however early it ends; if any plan is within it, the cheapest is, so the
        # earliest within it ends by the cheapest one's serial end.
        return max(makespan, cheapest_end)

    def missed(self, *, earliest_end: float, least_spent: float, now_seen: Goal) -> str:
        left = now_seen.device_seconds if isinstance(now_seen, Budget) else 0.0
        return (
            f"no plan stays within the budget of {self.device_seconds / 3600:.2f} device-hours: "
            f"{left / 3600:.2f} are left, and the cheapest plan of the trials left spends {least_spent / 3600:.2f}"
        )

    def summary(self) -> dict[str, Any]:
        return {"kind": self.name, "deadline": None, "budget_hours": self.device_seconds / 3600}

    @property
    def size_question(self) -> str:
        return "The earliest end within the budget"


MAKESPAN = Makespan()


def goal_of(
    deadline: float | str | None = None,
    budget: float | None = None,
    price_per_device_hour: float = 0.0,
    *,
    goal: Goal | None = None,
) -> Goal:
    """The goal that a sweep's options name: a ``deadline`` (seconds, or ``"8h"``), a ``budget`` in DEVICE-HOURS,
    neither (the makespan), or a ``goal`` instance; ``price_per_device_hour`` to report costs. Each is checked under
    the name the user gave it."""
    if goal is not None:
        if not isinstance(goal, Goal):
            raise TypeError(f"goal must be an optuna_saturn.planner.Goal (Makespan(), Deadline(...)), got {goal!r}.")
        if deadline is not None or budget is not None:
            raise ValueError("Give goal= or deadline=/budget=, not both: Deadline(...) and Budget(...) are goals.")
        return goal
    if deadline is not None and budget is not None:
        raise ValueError("A sweep has a deadline or a budget, not both: plan for one of them.")
    price = float(price_per_device_hour)
    if not (math.isfinite(price) and price >= 0):
        raise ValueError(f"price_per_device_hour must be >= 0, got {price_per_device_hour!r}.")
    if deadline is not None:
        seconds = parse_duration(deadline)
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"deadline must be a positive duration (seconds, or '90m', '8h'), got {deadline!r}.")
        return Deadline(seconds, price_per_device_hour=price)
    if budget is not None:
        hours = _positive(budget, "budget", "device-hours")
        return Budget(hours * 3600.0, price_per_device_hour=price)
    return Makespan(price_per_device_hour=price)


class DeadlineUnreachable(ValueError):
    """No plan of the sweep's trials ends by its deadline: raised before any trial starts, with the earliest end
    a plan reaches (``earliest_end``, seconds from the sweep's start). Give a later deadline or more devices, or
    plan for the makespan."""

    def __init__(self, message: str, earliest_end: float) -> None:
        super().__init__(message)
        self.earliest_end = earliest_end
