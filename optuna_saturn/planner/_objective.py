"""What a plan is best at: the planner's objective (DESIGN.md decision 17).

- **makespan** (the default): the earliest end.
- **deadline:** every job ends by ``deadline`` seconds (times are the plan's: from now, after what is ``busy``),
  at the fewest device-seconds. Efficient options win where the deadline allows them: a trial on 8 devices that
  runs 5x faster than on 1 spends 1.6x the device-seconds, a cost the deadline may not need. Where no plan meets
  it, the plan is the earliest-ending one, and says so (``plan.info["met"]`` is False).
- **budget:** the earliest end whose device-seconds stay within ``budget``; where none does, the plan with the
  fewest device-seconds, which says so.

A plan's device-seconds are what its jobs hold devices for: ``devices x runtime`` summed over its assignments. A
pool that can give idle devices back (a cloud or Ray cluster that scales down) pays only those; a fixed pool pays
for its devices whether they run or idle, and there a deadline saves no money, only energy and others' waiting.
With a ``price_per_device_hour``, a plan reports its cost too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from optuna_saturn.planner._types import Assignment, Plan

_TOL = 1e-6


def device_seconds(assignments: Iterable[Assignment]) -> float:
    """The device-seconds that ``assignments`` hold devices for."""
    return sum(a.option.devices * (a.end - a.start) for a in assignments)


@dataclass(frozen=True)
class Objective:
    """See the module's docstring. ``Objective()`` is makespan; give ``deadline`` (seconds) or ``budget``
    (device-seconds), not both."""

    deadline: float | None = None
    budget: float | None = None
    price_per_device_hour: float = 0.0

    def __post_init__(self) -> None:
        if self.deadline is not None and self.budget is not None:
            raise ValueError("An objective has a deadline or a budget, not both: plan for one of them.")
        for name, unit in (("deadline", "seconds"), ("budget", "device-seconds")):
            value = getattr(self, name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if value is not None and not (number and math.isfinite(value) and value > 0):
                raise ValueError(f"Objective.{name} must be a positive finite number of {unit}, got {value!r}.")
        if not (math.isfinite(self.price_per_device_hour) and self.price_per_device_hour >= 0):
            raise ValueError(f"price_per_device_hour must be >= 0, got {self.price_per_device_hour!r}.")

    @property
    def is_makespan(self) -> bool:
        """Whether plans are for the earliest end (a price per device-hour only adds costs to the reports)."""
        return self.deadline is None and self.budget is None

    @property
    def kind(self) -> str:
        return "deadline" if self.deadline is not None else "budget" if self.budget is not None else "makespan"

    def key(self, makespan: float, spent: float) -> tuple[float, float]:
        """What to minimise, in order: first how far the plan breaks the constraint (0 where it holds), then the
        measure the objective minimises."""
        if self.deadline is not None:
            return (max(0.0, makespan - self.deadline), spent)
        if self.budget is not None:
            return (max(0.0, spent - self.budget), makespan)
        return (makespan, spent)

    def plan_key(self, assignments: Iterable[Assignment]) -> tuple[float, float]:
        placed = list(assignments)
        return self.key(max((a.end for a in placed), default=0.0), device_seconds(placed))

    def problems(self, plan: Plan) -> list[str]:
        """How ``plan`` breaks this objective's constraint (empty when it holds, and always for makespan)."""
        if self.deadline is not None and plan.makespan > self.deadline * (1 + _TOL) + _TOL:
            return [f"the plan ends at {plan.makespan:.1f} s, past the deadline of {self.deadline:.1f} s."]
        spent = device_seconds(plan.assignments)
        if self.budget is not None and spent > self.budget * (1 + _TOL) + _TOL:
            return [f"the plan spends {spent:.1f} device-seconds, over the budget of {self.budget:.1f}."]
        return []

    def shifted(self, *, elapsed: float = 0.0, spent: float = 0.0) -> Objective:
        """The same objective for a plan made ``elapsed`` seconds later, after ``spent`` device-seconds (a sweep's
        re-plan: its deadline comes closer, its budget shrinks). A deadline or budget already passed keeps a
        sliver, so that the plan is the earliest or cheapest one and says it misses."""
        if self.deadline is not None:
            return Objective(
                deadline=max(self.deadline - elapsed, _TOL), price_per_device_hour=self.price_per_device_hour
            )
        if self.budget is not None:
            return Objective(budget=max(self.budget - spent, _TOL), price_per_device_hour=self.price_per_device_hour)
        return self

    def missed(self, *, earliest_end: float, least_spent: float, left: float) -> str:
        """Why no plan meets it: the earliest end any plan reaches, or the device-seconds the cheapest plan of the
        trials left spends against the ``left`` of the budget."""
        if self.deadline is not None:
            return f"no plan ends by the deadline of {self.deadline:.0f} s: the earliest end is {earliest_end:.0f} s"
        return (
            f"no plan stays within the budget of {(self.budget or 0.0) / 3600:.2f} device-hours: "
            f"{left / 3600:.2f} are left, and the cheapest plan of the trials left spends {least_spent / 3600:.2f}"
        )

    def report(self, plan: Plan) -> dict:
        """What ``plan.info`` says of it under this objective: its device-seconds and cost, whether it meets the
        objective's constraint."""
        spent = device_seconds(plan.assignments)
        out: dict = {"objective": self.kind, "device_seconds": round(spent, 3), "met": not self.problems(plan)}
        if self.price_per_device_hour:
            out["cost"] = round(spent / 3600 * self.price_per_device_hour, 2)
        return out


MAKESPAN = Objective()

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: float | str, name: str = "deadline") -> float:
    """Seconds, from a number of seconds or text such as ``"90m"``, ``"8h"``, ``"1d"`` or ``"1h30m"``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip().lower().replace(" ", "")
    match = re.fullmatch(r"((?:\d+(?:\.\d+)?[smhd])+|\d+(?:\.\d+)?)", text)
    if not match:
        raise ValueError(f"{name} must be seconds or a duration such as '90m', '8h' or '1h30m', got {value!r}.")
    if text[-1].isdigit():
        return float(text)
    return sum(float(n) * _UNITS[unit] for n, unit in re.findall(r"(\d+(?:\.\d+)?)([smhd])", text))


def objective_of(
    deadline: float | str | None = None, budget: float | None = None, price_per_device_hour: float = 0.0
) -> Objective:
    """The objective that a sweep's options name: a ``deadline`` (seconds, or ``"8h"``), a ``budget`` in
    device-hours, neither (the makespan); ``price_per_device_hour`` to report costs. Each is checked under the
    name the user gave it."""
    seconds = None if deadline is None else parse_duration(deadline)
    if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"deadline must be a positive duration (seconds, or '90m', '8h'), got {deadline!r}.")
    number = isinstance(budget, (int, float)) and not isinstance(budget, bool)
    if budget is not None and not (number and math.isfinite(budget) and budget > 0):
        raise ValueError(f"budget must be a positive finite number of device-hours, got {budget!r}.")
    return Objective(
        deadline=seconds,
        budget=None if budget is None else float(budget) * 3600.0,
        price_per_device_hour=float(price_per_device_hour),
    )


class DeadlineUnreachable(ValueError):
    """No plan of the sweep's trials ends by its deadline: raised before any trial starts, with the earliest end
    a plan reaches (``earliest_end``, seconds from the sweep's start). Give a later deadline or more devices, or
    plan for the makespan."""

    def __init__(self, message: str, earliest_end: float) -> None:
        super().__init__(message)
        self.earliest_end = earliest_end
