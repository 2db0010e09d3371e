"""Turning start times into concrete devices, and squeezing idle time out of a plan.

Devices within a node are interchangeable, so solvers only need to respect a count per node (a cumulative
constraint). Given such a schedule, concrete devices always exist: sweep the node's events in time order, release
devices at each end before taking them at each start; the count constraint guarantees enough are free.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from optuna_saturn.planner._types import Assignment, Cluster, Option, Reservation

_EPS = 1e-9


def assign_devices(
    items: Iterable[tuple[str, Option, int, float]], cluster: Cluster, *, busy: Sequence[Reservation] = ()
) -> list[Assignment]:
    """Concrete devices for ``(job, option, node, start)`` items whose device counts never exceed a node.

    Raises ``ValueError`` if at some instant a node would need more devices than it has.
    """
    per_node: dict[int, list[tuple[str, Option, float]]] = {}
    for job, option, node, start in items:
        per_node.setdefault(node, []).append((job, option, start))
    out: list[Assignment] = []
    for node, node_items in per_node.items():
        free_at = [0.0] * cluster.nodes[node]
        for r in busy:
            if r.node == node:
                for d in r.devices:
                    free_at[d] = max(free_at[d], float(r.until))
        for job, option, start in sorted(node_items, key=lambda x: (x[2], -x[1].devices, x[0])):
            candidates = [d for d in range(len(free_at)) if free_at[d] <= start + _EPS * max(1.0, start)]
            if len(candidates) < option.devices:
                raise ValueError(
                    f"Node {node} has {len(candidates)} free devices at t={start} but {job!r} needs {option.devices}."
                )
            # Best fit: take the devices that became free last, keeping long-free devices for wider jobs.
            chosen = sorted(sorted(candidates, key=lambda d: (-free_at[d], d))[: option.devices])
            end = start + option.runtime
            for d in chosen:
                free_at[d] = end
            out.append(Assignment(job, option, node, tuple(chosen), start, end))
    return out


def compact(
    assignments: Sequence[Assignment], cluster: Cluster, *, busy: Sequence[Reservation] = ()
) -> list[Assignment]:
    """Start every job as early as its own devices allow, keeping devices and the order on each device.

    Never moves a job later, so the makespan never grows; used after solvers that round times.
    """
    free_at = [[0.0] * n for n in cluster.nodes]
    for r in busy:
        for d in r.devices:
            free_at[r.node][d] = max(free_at[r.node][d], float(r.until))
    out = []
    for a in sorted(assignments, key=lambda a: (a.start, a.end, a.job)):
        start = max([free_at[a.node][d] for d in a.devices] + [0.0])
        start = min(start, a.start) if start <= a.start + _EPS else start
        end = start + a.option.runtime
        for d in a.devices:
            free_at[a.node][d] = end
        out.append(Assignment(a.job, a.option, a.node, a.devices, start, end))
    return out
