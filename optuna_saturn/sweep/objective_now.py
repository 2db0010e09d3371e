"""The sweep's objective as a plan made now sees it: a deadline as the time left, a budget as the device-seconds
left once the jobs that ran and run are paid (:meth:`~optuna_saturn.planner.Objective.shifted`)."""

from __future__ import annotations

from collections.abc import Sequence

from optuna_saturn.planner import Objective, Reservation
from optuna_saturn.sweep.state import SweepState, Waiting

#: Under a deadline, this share of the largest uncertainty among the options the waiting trials are planned on (an
#: option predicted 30% off: 15% of the time left; a trial not planned yet counts its surest option) is kept in
#: reserve; none where they are measured. A plan that fills the time to the deadline with slow, cheap options has
#: none left for a prediction that was short.
DEADLINE_SLACK = 0.5


def objective_now(objective: Objective, state: SweepState, busy: Sequence[Reservation], now: float) -> Objective:
    """``objective`` for a plan of the waiting trials made at ``now`` (``busy``: the running jobs' devices)."""
    spent = state.spent_by(now) + sum(len(r.devices) * r.until for r in busy)
    unsure = max((_uncertainty(w) for w in state.waiting.values()), default=0.0)
    spare = DEADLINE_SLACK * unsure * max(0.0, (objective.deadline or now) - now)
    return objective.shifted(elapsed=now + spare, spent=spent)


def _uncertainty(waiting: Waiting) -> float:
    if waiting.assignment is not None:
        planned = waiting.price.option(waiting.assignment.option.choice)
        if planned is not None:
            return planned.uncertainty
    return min((p.uncertainty for p in waiting.price.options), default=0.0)
