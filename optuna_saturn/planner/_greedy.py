"""Earliest-finish list scheduling: a fast, always-available plan, and the warm start for exact backends."""

from __future__ import annotations

from collections.abc import Sequence

from optuna_saturn.planner._types import Assignment, Cluster, Job, Plan, Reservation


def greedy(jobs: Sequence[Job], cluster: Cluster, *, busy: Sequence[Reservation] = ()) -> Plan:
    """Longest job first; each job takes the option and devices that let it finish earliest."""
    free_at = [[0.0] * n for n in cluster.nodes]
    for r in busy:
        for d in r.devices:
            free_at[r.node][d] = max(free_at[r.node][d], r.until)

    def best_runtime(job: Job) -> float:
        return min(o.runtime for o in job.options)

    assignments = []
    for job in sorted(jobs, key=lambda j: (-best_runtime(j), j.name)):
        best = None
        for option in job.options:
            for node, slots in enumerate(free_at):
                if option.devices > len(slots):
                    continue
                chosen = sorted(range(len(slots)), key=lambda d: (slots[d], d))[: option.devices]
                start = max(slots[d] for d in chosen)
                key = (start + option.runtime, option.devices, start)
                if best is None or key < best[0]:
                    best = (key, option, node, tuple(sorted(chosen)), start)
        if best is None:
            raise ValueError(f"Job {job.name!r} has no option that fits any node of {list(cluster.nodes)}.")
        _, option, node, devices, start = best
        for d in devices:
            free_at[node][d] = start + option.runtime
        assignments.append(Assignment(job.name, option, node, devices, start, start + option.runtime))
    return Plan(tuple(sorted(assignments, key=lambda a: (a.start, a.job))), solver="greedy")
