"""The fewest nodes that meet a deadline: where devices are rented by the node (a cloud's Ray cluster), a node the
plan leaves without work is one the sweep can give back, and the hours it would have held idle are not paid.

A plan for a deadline spreads its trials over every node, whatever it needs. :func:`fewest_nodes` leaves out one
node at a time, the one with the least planned work that no running job holds, while a plan on the nodes left
still meets the deadline; a running job's node is kept (it is given back later, once it is idle: the sweep's
releasing policy), and so is the last node of the largest size (a trial whose options need it, now or run again
after a fault, has no other). One plan per node left out, and one more that fails: a few on the clusters this
serves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from optuna_saturn.planner._types import Cluster, Plan, Reservation

#: Plans ``jobs`` on a cluster with ``busy`` reservations (all else fixed by the caller).
Solve = Callable[[Cluster, Sequence[Reservation]], Plan]


def fewest_nodes(plan: Plan, cluster: Cluster, busy: Sequence[Reservation], solve: Solve) -> Plan:
    """``plan`` (which meets its deadline: ``info["met"]``), or one on fewer of ``cluster``'s nodes that also meets
    it, in ``cluster``'s node indices: the nodes left out get no work."""
    kept, best = list(range(len(cluster.nodes))), plan
    held = {r.node for r in busy}
    while len(kept) > 1:
        work = dict.fromkeys(kept, 0.0)
        for a in best.assignments:
            work[a.node] += len(a.devices) * (a.end - a.start)
        largest = [n for n in kept if cluster.nodes[n] == max(cluster.nodes)]
        free = [n for n in kept if n not in held and (len(largest) > 1 or n not in largest)]
        if not free:
            return best
        left_out = min(free, key=lambda n: (work[n], -n))
        trial = [n for n in kept if n != left_out]
        local = {n: i for i, n in enumerate(trial)}
        try:
            fewer = solve(Cluster([cluster.nodes[n] for n in trial]), [replace(r, node=local[r.node]) for r in busy])
        except ValueError:  # (a job no node left can hold)
            return best
        if not fewer.info.get("met"):
            return best
        kept = trial
        best = replace(fewer, assignments=tuple(replace(a, node=trial[a.node]) for a in fewer.assignments))
    return best
