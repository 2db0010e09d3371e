"""Input checks and dominance pruning, shared by every backend.

Pruning is sound for makespan: an option with at least as many devices and at least as long a runtime as another
option of the same job can be replaced by that other option in any schedule (on the same devices, subset of them,
same start) without delaying anything, so an optimal plan never needs it. Options that fit on no node are dropped
too. Fewer options mean smaller models for the MILP and CP-SAT backends.
"""

from __future__ import annotations

from collections.abc import Sequence

from optuna_saturn.planner._types import Cluster, Job, Option, Reservation


def check_inputs(jobs: Sequence[Job], cluster: Cluster, busy: Sequence[Reservation] = ()) -> None:
    """Raise ``ValueError`` for duplicate job names, jobs that fit on no node, and malformed reservations."""
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"Job names must be unique; duplicated: {dup}.")
    largest = max(cluster.nodes)
    for job in jobs:
        if all(o.devices > largest for o in job.options):
            raise ValueError(
                f"Job {job.name!r} has no option that fits any node of {list(cluster.nodes)} "
                f"(smallest option needs {min(o.devices for o in job.options)} devices)."
            )
    for r in busy:
        if not 0 <= r.node < len(cluster.nodes):
            raise ValueError(f"Reservation {r!r} names node {r.node}, but the cluster has {len(cluster.nodes)}.")
        if len(set(r.devices)) != len(r.devices) or any(not 0 <= d < cluster.nodes[r.node] for d in r.devices):
            raise ValueError(f"Reservation {r!r} names devices outside node {r.node} or repeats one.")


def prune_options(options: Sequence[Option], max_devices: int) -> tuple[Option, ...]:
    """Options that fit ``max_devices`` and are not dominated, sorted by device count.

    Among exact ties (same devices and runtime) the first by strategy name is kept, so pruning is deterministic.
    """
    fitting = sorted((o for o in options if o.devices <= max_devices), key=lambda o: (o.devices, o.runtime, o.choice))
    kept: list[Option] = []
    for o in fitting:
        # Sorted by devices ascending: o is dominated iff some kept option (fewer or equal devices) is as fast.
        if kept and min(k.runtime for k in kept) <= o.runtime:
            continue
        kept.append(o)
    return tuple(kept)


def prune_jobs(jobs: Sequence[Job], cluster: Cluster) -> list[Job]:
    """The same jobs with dominated and non-fitting options removed (names and order unchanged)."""
    largest = max(cluster.nodes)
    return [Job(j.name, prune_options(j.options, largest)) for j in jobs]
