"""A valid lower bound on the makespan of any plan, used to report optimality gaps and to stop solvers early."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from optuna_saturn.planner._options import prune_options
from optuna_saturn.planner._types import Cluster, Job, Reservation


def lower_bound(jobs: Sequence[Job], cluster: Cluster, *, busy: Sequence[Reservation] = ()) -> float:
    """The smallest ``T`` that passes every necessary condition below; any plan's makespan is at least this.

    Proof sketch. Let ``C`` be the makespan of any feasible plan. Every job then runs with an option whose runtime is
    at most ``C`` (so ``C >= max_j`` fastest runtime of ``j``). For a horizon ``T`` write ``A_j(T)`` for the
    smallest device-seconds ``devices * runtime`` among ``j``'s options with ``runtime <= T`` and ``d_j(T)`` for the
    fewest devices among them. Each condition below has the form ``lhs(T) <= capacity * T`` with ``lhs``
    non-increasing in ``T`` faster than the right side grows, so the set of ``T`` passing all of them is an
    interval ``[LB, inf)`` that contains ``C``; hence ``LB <= C``.

    1. Area per node-size class, for every node size ``s`` (and ``s = 0``): jobs with ``d_j(T) > s`` can only run
       on nodes with more than ``s`` devices, so their total ``A_j(T)``, plus the device-seconds of reservations on
       those nodes before ``T``, fits in ``T`` times those nodes' devices. With ``s = 0`` this is the classic area
       bound, tightened because options slower than ``T`` are excluded (moldable-job bound).
    2. Concurrency: on a node with at most ``M`` devices (the largest node) at most ``k`` jobs that each need more
       than ``M / (k + 1)`` devices run at once. So the runtimes of jobs with ``d_j(T) > M / (k + 1)``, plus the
       time reservations of that size hold before ``T``, sum to at most ``k * T * (number of nodes)``. With
       ``k = 1`` this says jobs needing more than half a node run one after another.

    ``busy`` reservations are taken into account when given (devices held from 0 to ``until``).
    """
    if not jobs:
        return 0.0
    largest = max(cluster.nodes)
    options = [sorted(prune_options(j.options, largest), key=lambda o: o.runtime) for j in jobs]
    if any(not opts for opts in options):
        raise ValueError("Some job has no option that fits any node.")
    runtimes = [[o.runtime for o in opts] for opts in options]
    # Prefix minima over options sorted by runtime: area and devices of the best option among the first i.
    area_prefix, dev_prefix = [], []
    for opts in options:
        a, d, best_a, best_d = [], [], float("inf"), 10**9
        for o in opts:
            best_a, best_d = min(best_a, o.devices * o.runtime), min(best_d, o.devices)
            a.append(best_a)
            d.append(best_d)
        area_prefix.append(a)
        dev_prefix.append(d)
    fastest = [r[0] for r in runtimes]
    reservations = _merge_busy(busy)
    sizes = sorted(set(cluster.nodes))
    size_classes = [0, *sizes[:-1]]
    thresholds = sorted({largest // (k + 1) for k in range(1, largest)}, reverse=True)  # d > M/(k+1) <=> d > floor.
    count_caps = {t: min(k for k in range(1, largest) if largest // (k + 1) == t) for t in thresholds}

    def conditions(T: float) -> list[tuple[float, float, float]]:
        """(lhs at T, lhs slope just above T, capacity per unit of T) for every condition."""
        idx = [bisect.bisect_right(r, T) - 1 for r in runtimes]
        out = []
        for s in size_classes:
            cap = sum(n for n in cluster.nodes if n > s)
            lhs = sum(area_prefix[j][i] for j, i in enumerate(idx) if dev_prefix[j][i] > s)
            slope = 0.0
            for node, n_dev, until in reservations:
                if cluster.nodes[node] > s:
                    lhs += n_dev * min(until, T)
                    slope += n_dev if until > T else 0.0
            out.append((lhs, slope, float(cap)))
        for t in thresholds:
            lhs = sum(fastest[j] for j, i in enumerate(idx) if dev_prefix[j][i] > t)
            slope = 0.0
            for _node, n_dev, until in reservations:
                if n_dev > t:
                    lhs += min(until, T)
                    slope += 1.0 if until > T else 0.0
            out.append((lhs, slope, float(count_caps[t] * len(cluster.nodes))))
        return out

    def feasible(T: float) -> bool:
        return all(lhs <= cap * T * (1 + 1e-12) + 1e-12 for lhs, _, cap in conditions(T))

    start = max(fastest)
    points = sorted(
        {start} | {r for rs in runtimes for r in rs if r > start} | {u for *_, u in reservations if u > start}
    )
    # First breakpoint that passes (the last one always does unless reservations alone overflow; then extrapolate).
    lo, hi = 0, len(points) - 1
    if not feasible(points[hi]):
        return _solve_linear(conditions(points[hi]), points[hi])
    while lo < hi:
        mid = (lo + hi) // 2
        if feasible(points[mid]):
            hi = mid
        else:
            lo = mid + 1
    if lo == 0:
        return points[0]
    # The answer lies in (points[lo-1], points[lo]]; there every lhs is linear, as evaluated just above points[lo-1].
    return min(points[lo], _solve_linear(conditions(points[lo - 1]), points[lo - 1]))


def _solve_linear(conds: list[tuple[float, float, float]], base: float) -> float:
    """Smallest T >= base with lhs + slope * (T - base) <= cap * T for every condition."""
    best = base
    for lhs, slope, cap in conds:
        if lhs <= cap * base:
            continue
        if cap <= slope:
            return float("inf")
        best = max(best, (lhs - slope * base) / (cap - slope))
    return best


def _merge_busy(busy: Sequence[Reservation]) -> list[tuple[int, int, float]]:
    """(node, number of devices, until) per reservation, ignoring reservations already over."""
    return [(r.node, len(r.devices), float(r.until)) for r in busy if r.until > 0 and r.devices]
