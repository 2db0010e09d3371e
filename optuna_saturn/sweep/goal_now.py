"""The sweep's goal (the planner's: :class:`~optuna_saturn.planner.Goal`) as a plan made now sees it: a deadline as
the time left, a budget as the device-seconds left once the jobs that ran and run are paid
(:meth:`~optuna_saturn.planner.Goal.shifted`); and what is said when the plans miss it."""

from __future__ import annotations

from collections.abc import Sequence

import optuna

from optuna_saturn.planner import Goal, Plan, Reservation
from optuna_saturn.sweep.state import SweepState, Waiting

_logger = optuna.logging.get_logger("optuna.saturn")

#: Under a deadline, this share of the largest uncertainty among the options the waiting trials are planned on (an
#: option predicted 30% off: 15% of the time left; a trial not planned yet counts its surest option) is kept in
#: reserve; none where they are measured. A plan that fills the time to the deadline with slow, cheap options has
#: none left for a prediction that was short.
DEADLINE_SLACK = 0.5


def goal_now(goal: Goal, state: SweepState, busy: Sequence[Reservation], now: float, *, unsure: float = 0.0) -> Goal:
    """``goal`` for a plan of the waiting trials made at ``now`` (``busy``: the running jobs' devices;
    ``unsure``: the uncertainty of trials planned beside the waiting ones)."""
    spent = state.spent_by(now) + sum(len(r.devices) * r.until for r in busy)
    unsure = max([unsure, *(_uncertainty(w) for w in state.waiting.values())])
    spare = DEADLINE_SLACK * unsure * goal.seconds_left(now)
    return goal.shifted(elapsed=now + spare, spent=spent)


def _uncertainty(waiting: Waiting) -> float:
    if waiting.assignment is not None:
        planned = waiting.price.option(waiting.assignment.option.choice)
        if planned is not None:
            return planned.uncertainty
    return min((p.uncertainty for p in waiting.price.options), default=0.0)


class Misses:
    """Plans that miss the goal: the first plan's miss of a goal that refuses a first miss (a deadline) refuses the
    sweep; a later miss (of the deadline, or of a budget) is said once, and the sweep goes on. Its memory (whether it
    was said) is its own."""

    def __init__(self, goal: Goal) -> None:
        self._goal = goal
        self._said = False

    def refusal(self, plan: Plan, earliest: float, now_seen: Goal, *, first: bool) -> str:
        """Why the sweep is refused (its trials, those to come included, end at ``earliest`` at the earliest, after
        its deadline, and ``plan`` is its first), or ""."""
        goal = self._goal
        if not goal.misses(plan, earliest):
            self._said = False
            return ""
        least = plan.info.get("device_seconds", 0.0)
        why = goal.missed(earliest_end=earliest, least_spent=least, now_seen=now_seen)
        if goal.refuses_first_miss and first:
            return f"{why}. Give a later deadline or more devices, or leave the deadline out."
        if not self._said:
            _logger.warning(f"The sweep's plan misses its {goal.name}: {why}.")
        self._said = True
        return ""
