"""The sweep's objective as a plan made now sees it: a deadline as the time left, a budget as the device-seconds
left once the jobs that ran and run are paid (:meth:`~optuna_saturn.planner.Objective.shifted`)."""

from __future__ import annotations

from collections.abc import Sequence

from optuna_saturn.planner import Objective, Reservation
from optuna_saturn.sweep.state import SweepState

#: Under a deadline, this share of the waiting trials' largest uncertainty (an option predicted 30% off: 15% of the
#: time left) is kept in reserve; none where every option is measured. A plan that fills the time to the deadline
#: with slow, cheap options has none left for a prediction that was short.
DEADLINE_SLACK = 0.5


def objective_now(objective: Objective, state: SweepState, busy: Sequence[Reservation], now: float) -> Objective:
    """``objective`` for a plan of the waiting trials made at ``now`` (``busy``: the running jobs' devices)."""
    spent = state.spent_by(now) + sum(len(r.devices) * r.until for r in busy)
    unsure = max((p.uncertainty for w in state.waiting.values() for p in w.price.options), default=0.0)
    spare = DEADLINE_SLACK * unsure * max(0.0, (objective.deadline or now) - now)
    return objective.shifted(elapsed=now + spare, spent=spent)
