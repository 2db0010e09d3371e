"""Moldable list scheduling: choose every job's option for a target makespan, then list-schedule.

Why: the earliest-finish greedy grabs fast, wide options early and wastes device-seconds. The classic remedy for
moldable jobs (Turek, Wolf and Yu, 1992) is to fix a target ``T``, give every job its cheapest option (fewest
device-seconds) among those not slower than ``T``, and list-schedule the result; trying many ``T`` and keeping the
best plan costs a few milliseconds each. This is the planner's workhorse for large instances and a warm start for
the exact backends.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from optuna_saturn.planner._frees import NodeFrees
from optuna_saturn.planner._goal import MAKESPAN, Goal
from optuna_saturn.planner._types import Assignment, Cluster, Job, Option, Plan, Reservation
from optuna_saturn.planner._work_limit import WorkLimit


def schedule_in_order(
    seq: Sequence[tuple[Job, Sequence[Option]]], cluster: Cluster, *, busy: Sequence[Reservation] = ()
) -> list[Assignment]:
    """Place jobs one by one, in order, each with the option, node and devices that finish it earliest.

    A job goes on the ``devices`` devices of a node that free up first and starts when the last of them frees
    (no back-filling, so every device runs its jobs in placement order).
    """
    frees = NodeFrees(cluster, busy, sizes={o.devices for _, options in seq for o in options})
    out = []
    for job, options in seq:
        best = None
        for option in options:
            found = frees.best(option.devices)
            if found is None:
                continue
            start, idle, node = found
            end = start + option.runtime
            # Earliest end; then least idle created; then fewer devices; then node index.
            key = (end, idle, option.devices, node)
            if best is None or key < best[0]:
                best = (key, option, node, start, end)
        if best is None:
            raise ValueError(f"Job {job.name!r} has no option that fits any node of {list(cluster.nodes)}.")
        _, option, node, start, end = best
        free = frees.free[node]
        # Among devices free by ``start`` take those freed last (best fit), keeping early ones for others.
        ready = [d for d in frees.order[node] if free[d] <= start]
        chosen = sorted(sorted(ready, key=lambda d: (-free[d], d))[: option.devices])
        frees.place(node, chosen, end)
        out.append(Assignment(job.name, option, node, tuple(chosen), start, end))
    return out


def allot(job: Job, target: float) -> tuple[Option, ...]:
    """The cheapest options (device-seconds) of ``job`` that are not slower than ``target``, or its fastest."""
    allowed = [o for o in job.options if o.runtime <= target]
    if not allowed:
        return (min(job.options, key=lambda o: (o.runtime, o.devices)),)
    cheapest = min(o.devices * o.runtime for o in allowed)
    return tuple(o for o in allowed if o.devices * o.runtime <= cheapest * (1 + 1e-9))


def list_schedule(
    jobs: Sequence[Job],
    cluster: Cluster,
    *,
    busy: Sequence[Reservation] = (),
    lower: float | None = None,
    upper: float | None = None,
    time_limit: float = 5.0,
    steps: int = 48,
    work_limit: WorkLimit | None = None,
    goal: Goal = MAKESPAN,
) -> Plan:
    """Best plan over target makespans between ``lower`` and ``upper`` (geometric grid), two job orders each.

    Options of a job are its cheapest ones under the target; a job whose cheapest options would end past the
    target may also take any option that finishes earlier (so the tail is not left to a slow, thin option).
    Targets are tried until ``time_limit`` seconds have passed, or, given ``work_limit``, until that many options
    were weighed (then the wall clock is not read, and the plan is the same on any machine). Under a deadline or
    a budget (``goal``), the best plan is the goal's, and the targets reach the slowest options too.
    """
    t0 = time.perf_counter()
    weighed = 0
    if not jobs:
        return Plan((), solver="list")
    largest = max(cluster.nodes)
    jobs = [Job(j.name, [o for o in j.options if o.devices <= largest]) for j in jobs]
    fastest = max(min(o.runtime for o in j.options) for j in jobs)
    lo = max(lower or 0.0, fastest, 1e-12)
    hi = max(upper or 0.0, lo * 4)
    if not goal.earliest_end:  # (the cheapest options are the slow ones: the goal decides how slow)
        hi = max(goal.latest_end(hi), max(o.runtime for j in jobs for o in j.options))
    targets = sorted({lo * (hi / lo) ** (i / (steps - 1)) for i in range(steps)})

    def score(placed: list[Assignment]) -> tuple[float, ...]:
        return (max(a.end for a in placed),) if goal.earliest_end else goal.plan_key(placed)

    best: list[Assignment] | None = None
    best_score: tuple[float, ...] = (float("inf"),)
    seen: set[tuple] = set()
    for target in targets:
        allotment = [(j, allot(j, target)) for j in jobs]
        key = tuple(opts for _, opts in allotment)
        if key in seen:
            continue
        seen.add(key)
        orders = (
            sorted(allotment, key=lambda x: (-x[1][0].runtime, -x[1][0].devices, x[0].name)),
            sorted(allotment, key=lambda x: (-x[1][0].devices, -x[1][0].runtime, x[0].name)),
        )
        for seq in orders:
            plan = schedule_in_order(seq, cluster, busy=busy)
            if _better(score(plan), best_score):
                best, best_score = plan, score(plan)
            # Repair the tail: let jobs also take any faster option (earliest finish decides).
            widened = [
                (
                    j,
                    tuple(
                        sorted(
                            set(opts) | {o for o in j.options if o.runtime < opts[0].runtime},
                            key=lambda o: (o.devices, o.runtime, o.choice),
                        )
                    ),
                )
                for j, opts in seq
            ]
            weighed += sum(len(opts) for _, opts in seq) + sum(len(opts) for _, opts in widened)
            plan = schedule_in_order(widened, cluster, busy=busy)
            if _better(score(plan), best_score):
                best, best_score = plan, score(plan)
        if (
            (weighed >= work_limit.list_placements)
            if work_limit is not None
            else (time.perf_counter() - t0 > time_limit)
        ):
            break
    assert best is not None
    return Plan(tuple(sorted(best, key=lambda a: (a.start, a.job))), solver="list")


def _better(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """``a`` is lower than ``b`` by more than rounding, in the first part where they differ by more."""
    for x, y in zip(a, b):
        if x < y - 1e-9:
            return True
        if x > y + 1e-9:
            return False
    return False
