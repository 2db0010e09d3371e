"""Iterated list scheduling: a seeded local search over job orders and allotments, for large instances.

Why: on instances of 100 and more jobs the exact backends rarely improve the list heuristic within seconds (CP-SAT
on 120 jobs over [8, 8, 4] devices, 10 s on 2 cores: no gain on 7 of 9 planted-optimum instances, 1.03-1.09 of
the optimum), while list scheduling itself is milliseconds per plan. So try thousands of plans: half of them a
fresh allotment (every job's cheapest options under a target drawn near the best makespan) in a randomly
perturbed longest-first order, half the best order so far with a few jobs swapped; keep any plan no longer than
the best (moves across plateaus). ``benchmarks/planted_optimum.py`` measures it: 1.005-1.027 of the optimum.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from optuna_saturn.planner._list import allot, schedule_in_order
from optuna_saturn.planner._types import Cluster, Job, Option, Plan, Reservation
from optuna_saturn.planner._work_limit import WorkLimit

_Sequence = list[tuple[Job, tuple[Option, ...]]]


def iterated_list(
    jobs: Sequence[Job],
    cluster: Cluster,
    *,
    start: Plan,
    busy: Sequence[Reservation] = (),
    time_limit: float,
    seed: int = 0,
    lower_bound: float = 0.0,
    work_limit: WorkLimit | None = None,
) -> Plan:
    """The best plan found within ``time_limit``, starting from ``start`` (a valid plan of ``jobs``); never worse
    than ``start``. Seeded, but bounded by time: a faster machine tries more plans. Given ``work_limit``, the search
    stops once it has weighed that many options instead, and the plan depends only on the inputs and ``seed``."""
    t0 = time.perf_counter()
    weighed, most = 0, None if work_limit is None else work_limit.search_placements
    rng = random.Random(seed)
    by_name = {j.name: j for j in jobs}
    best_seq: _Sequence = [
        (by_name[a.job], (a.option,)) for a in sorted(start.assignments, key=lambda a: (a.start, a.job))
    ]
    best_plan, best = None, start.makespan
    while best > lower_bound * (1 + 1e-9) and (
        weighed < most if most is not None else time.perf_counter() - t0 < time_limit
    ):
        seq = _fresh(jobs, best, rng) if rng.random() < 0.5 else _swapped(best_seq, rng)
        weighed += sum(len(options) for _, options in seq)
        plan = schedule_in_order(seq, cluster, busy=busy)
        makespan = max(a.end for a in plan)
        if makespan <= best + 1e-9:
            if makespan < best - 1e-9:
                best_plan = plan
            best, best_seq = min(best, makespan), seq
    if best_plan is None:
        return start
    return Plan(tuple(sorted(best_plan, key=lambda a: (a.start, a.job))), solver="search")


def _fresh(jobs: Sequence[Job], best: float, rng: random.Random) -> _Sequence:
    """Every job's cheapest options under a target near ``best``, longest first, each length perturbed."""
    target = best * rng.uniform(0.85, 1.05)
    width = rng.choice((0.0, 0.5, 1.0))  # how much a job's width counts in its priority
    keyed = []
    for job in jobs:
        options = allot(job, target)
        keyed.append(
            (-options[0].runtime * options[0].devices ** width * rng.uniform(0.7, 1.3), job.name, job, options)
        )
    keyed.sort(key=lambda k: (k[0], k[1]))
    return [(job, options) for _, _, job, options in keyed]


def _swapped(seq: _Sequence, rng: random.Random) -> _Sequence:
    out = list(seq)
    for _ in range(rng.randint(1, 4)):
        i, j = rng.randrange(len(out)), rng.randrange(len(out))
        out[i], out[j] = out[j], out[i]
    return out
