"""Current-practice baselines from DESIGN.md, used by benchmarks to measure what the planner buys.

They are plans like any other (valid, concrete devices), so the simulator and ``validate`` treat them the same.
"""

from __future__ import annotations

from collections.abc import Sequence

from optuna_saturn.planner._list import schedule_in_order
from optuna_saturn.planner._types import Assignment, Cluster, Job, Option, Plan, Reservation


def sequential_max(
    jobs: Sequence[Job], cluster: Cluster, *, busy: Sequence[Reservation] = (), strategy: str = "fsdp"
) -> Plan:
    """Every trial one after another on all devices of a node, with one fixed strategy.

    Per trial: the ``strategy`` option with the most devices that fits a node; if the trial has no such option, its
    option with the most devices that fits (fastest among those). Trials run in the given order, each on the node
    that frees first (with one node, strictly one after another).
    """
    seq = []
    for job in jobs:
        fitting = _fitting(job, cluster)
        pool = [o for o in fitting if o.strategy == strategy] or fitting
        option = max(pool, key=lambda o: (o.devices, -o.runtime))
        seq.append((job, (option,)))
    free = [0.0] * len(cluster.nodes)
    for r in busy:
        free[r.node] = max(free[r.node], float(r.until))
    out = []
    for job, (option,) in seq:
        node = min((i for i, n in enumerate(cluster.nodes) if n >= option.devices), key=lambda i: (free[i], i))
        start, end = free[node], free[node] + option.runtime
        out.append(Assignment(job.name, option, node, tuple(range(option.devices)), start, end))
        free[node] = end
    return Plan(tuple(out), solver="sequential-max")


def task_parallel(jobs: Sequence[Job], cluster: Cluster, *, busy: Sequence[Reservation] = ()) -> Plan:
    """Optuna ``n_jobs = #devices``: one device per trial with its fastest single-device option.

    Trials that fit on no single device take the fastest option with the smallest device count that fits. Trials
    are taken in the given order (like a worker pool pulling from a queue), each as soon as enough devices free up.
    """
    seq = []
    for job in jobs:
        fitting = _fitting(job, cluster)
        fewest = min(o.devices for o in fitting)
        option: Option = min((o for o in fitting if o.devices == fewest), key=lambda o: (o.runtime, o.choice))
        seq.append((job, (option,)))
    return Plan(tuple(schedule_in_order(seq, cluster, busy=busy)), solver="task-parallel")


def _fitting(job: Job, cluster: Cluster) -> list[Option]:
    """The job's options that fit the largest node (a baseline never splits a trial across nodes)."""
    fitting = [o for o in job.options if o.devices <= max(cluster.nodes)]
    if not fitting:
        raise ValueError(f"Job {job.name!r} has no option that fits any node of {list(cluster.nodes)}.")
    return fitting
