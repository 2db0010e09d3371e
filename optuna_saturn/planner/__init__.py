"""SPASE planner: pick one option per job, concrete devices and a start, minimising the makespan.

Pure: no processes, no Optuna. See DESIGN.md decision 6.
"""

from __future__ import annotations

from collections.abc import Sequence

from optuna_saturn.planner._greedy import greedy
from optuna_saturn.planner._types import Assignment, Cluster, Job, Option, Plan, Reservation

__all__ = ["Assignment", "Cluster", "Job", "Option", "Plan", "Reservation", "lower_bound", "solve"]


def lower_bound(jobs: Sequence[Job], cluster: Cluster) -> float:
    """max(longest job at its fastest, total device-seconds at each job's cheapest / total devices)."""
    if not jobs:
        return 0.0
    longest = max(min(o.runtime for o in j.options) for j in jobs)
    area = sum(min(o.devices * o.runtime for o in j.options) for j in jobs) / cluster.total_devices
    return max(longest, area)


def solve(
    jobs: Sequence[Job],
    cluster: Cluster,
    solver: str = "auto",
    time_limit: float = 10.0,
    *,
    busy: Sequence[Reservation] = (),
    seed: int = 0,
) -> Plan:
    """Plan ``jobs`` on ``cluster``. ``busy`` holds devices already taken by running trials."""
    plan = greedy(jobs, cluster, busy=busy)
    return Plan(plan.assignments, solver=plan.solver, lower_bound=lower_bound(jobs, cluster))
