"""Earliest-finish list scheduling: a fast, always-available plan, and the warm start for exact backends."""

from __future__ import annotations

from collections.abc import Sequence

from optuna_saturn.planner._frees import NodeFrees
from optuna_saturn.planner._types import Assignment, Cluster, Job, Plan, Reservation


def greedy(jobs: Sequence[Job], cluster: Cluster, *, busy: Sequence[Reservation] = ()) -> Plan:
    """Longest job first; each job takes the option and devices that let it finish earliest."""
    frees = NodeFrees(cluster, busy, sizes={o.devices for j in jobs for o in j.options}, by_idle=False)

    def best_runtime(job: Job) -> float:
        return min(o.runtime for o in job.options)

    assignments = []
    for job in sorted(jobs, key=lambda j: (-best_runtime(j), j.name)):
        best = None
        for option in job.options:
            found = frees.best(option.devices)
            if found is None:
                continue
            start, _, node = found
            key = (start + option.runtime, option.devices, start)
            if best is None or key < best[0]:
                best = (key, option, node, start)
        if best is None:
            raise ValueError(f"Job {job.name!r} has no option that fits any node of {list(cluster.nodes)}.")
        _, option, node, start = best
        devices = tuple(sorted(frees.order[node][: option.devices]))  # its earliest free devices
        frees.place(node, devices, start + option.runtime)
        assignments.append(Assignment(job.name, option, node, devices, start, start + option.runtime))
    return Plan(tuple(sorted(assignments, key=lambda a: (a.start, a.job))), solver="greedy")
