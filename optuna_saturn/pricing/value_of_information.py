"""Whether measuring an option is worth what the measurement costs: the value of information.

Measuring every option of every new workload costs more device time than it can save (on the example sweep it
took half of all device time). An option that has not been measured is priced by the cost model, with an
uncertainty. Measuring it pays only if the plan could be shorter with what the measurement may show: the gain is
the makespan of a plan without that option minus the makespan of a plan with it at its optimistic runtime (its
prediction less its uncertainty). If no plan would use the option even then, the gain is zero and it is not
measured. The cost is the device time the measurement takes, spread over the pool (its share of the makespan).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from optuna_saturn.planner import Cluster, Job, Reservation, solve

#: Plans compared here are quick heuristics: the decision needs their difference, not their last percent.
_SOLVER = "list"
_TIME_LIMIT = 0.05


def profile_gain(
    jobs: Sequence[Job],
    cluster: Cluster,
    job: str,
    choice: tuple[str, int, int],
    optimistic_runtime: float,
    *,
    busy: Sequence[Reservation] = (),
) -> float:
    """Seconds of makespan that measuring ``job``'s option ``choice`` could save (0 when it cannot change the
    plan, or when the job has no other option: then its first real run measures it anyway)."""
    target = next(j for j in jobs if j.name == job)
    others = [o for o in target.options if o.choice != choice]
    if not others or len(others) == len(target.options):
        return 0.0
    without = [Job(j.name, others) if j.name == job else j for j in jobs]
    optimistic = [
        Job(j.name, [replace(o, runtime=optimistic_runtime) if o.choice == choice else o for o in j.options])
        if j.name == job
        else j
        for j in jobs
    ]
    plain = solve(without, cluster, _SOLVER, _TIME_LIMIT, busy=busy).makespan
    hopeful = solve(optimistic, cluster, _SOLVER, _TIME_LIMIT, busy=busy)
    uses_it = any(a.job == job and a.option.choice == choice for a in hopeful.assignments)
    return max(0.0, plain - hopeful.makespan) if uses_it else 0.0


def worth_measuring(gain: float, measurement_seconds: float, devices: int, cluster: Cluster) -> bool:
    """Measure when the makespan it may save exceeds its cost: ``devices`` busy for ``measurement_seconds``,
    as a share of the whole pool."""
    return gain > measurement_seconds * devices / cluster.total_devices
