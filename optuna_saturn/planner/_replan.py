"""Event-driven re-planning with hysteresis (DESIGN.md decision 7).

The executor calls ``replan`` whenever a trial ends, is pruned or fails, or new trials arrive. Running trials are
fixed (``busy``, with their estimated remaining time); pending trials are free. The previous plan, shifted to the
new "now" and repaired (kept devices and order, corrected runtimes, new trials appended), competes with a fresh
solve; the fresh plan wins only if it is shorter by ``min_improvement``. This keeps a tiny gain from reshuffling
every trial's devices (which would invalidate the launcher's device choices and warm caches for nothing).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

from optuna_saturn.planner._goal import MAKESPAN, Goal
from optuna_saturn.planner._list import allot, schedule_in_order
from optuna_saturn.planner._options import check_inputs
from optuna_saturn.planner._solve import solve
from optuna_saturn.planner._types import Assignment, Cluster, Job, Option, Plan, Reservation
from optuna_saturn.planner._work_limit import WorkLimit


def replan(
    previous: Plan | None,
    jobs: Sequence[Job],
    cluster: Cluster,
    *,
    busy: Sequence[Reservation] = (),
    solver: str = "auto",
    time_limit: float = 5.0,
    seed: int = 0,
    min_improvement: float = 0.02,
    min_gain: float = 0.0,
    work_limit: WorkLimit | None = None,
    goal: Goal = MAKESPAN,
) -> Plan:
    """Re-plan the pending ``jobs`` (times from now) given running trials in ``busy``.

    ``previous`` is the plan being executed (any time origin: only its options, nodes, devices and order are
    reused). The fresh plan replaces the repaired previous one only if its makespan is lower by more than
    ``min_improvement`` (relative) and by more than ``min_gain`` seconds. ``plan.info["replan"]`` says which won
    ("kept", "replaced" or "fresh" when there was nothing to keep), with both makespans. ``work_limit``: see
    :func:`~optuna_saturn.planner.solve` (a budget of work in place of ``time_limit``: the same plan on any machine).
    Under a deadline or a budget (``goal``), the fresh plan wins if it breaks the goal's constraint less,
    or as little and improves its measure (device-seconds, or the end) by more than ``min_improvement``.
    """
    check_inputs(jobs, cluster, busy)
    kept = repair(previous, jobs, cluster, busy=busy) if previous is not None else None
    fresh = solve(
        jobs,
        cluster,
        solver=solver,
        time_limit=time_limit,
        busy=busy,
        seed=seed,
        hint=kept,
        work_limit=work_limit,
        goal=goal,
    )
    if kept is None:
        fresh.info.update(replan="fresh", fresh_makespan=fresh.makespan)
        return fresh
    if goal.earliest_end:
        threshold = min(kept.makespan * (1.0 - min_improvement), kept.makespan - min_gain)
        winner = fresh if fresh.makespan < threshold - 1e-9 else kept
    else:
        winner = fresh if improves(goal, kept, fresh, min_improvement) else kept
    out = Plan(
        winner.assignments,
        solver=winner.solver if winner is fresh else "kept",
        lower_bound=fresh.lower_bound,
        solve_seconds=fresh.solve_seconds,
        optimal=winner.makespan <= fresh.lower_bound * (1 + 1e-9),
    )
    out.info.update(
        replan="replaced" if winner is fresh else "kept", kept_makespan=kept.makespan, fresh_makespan=fresh.makespan
    )
    if not goal.earliest_end:
        out.info.update(goal.report(out))
        if not out.info["met"]:
            out.info["earliest_end"] = fresh.info.get("earliest_end", fresh.makespan)
    return out


def improves(goal: Goal, before: Plan, after: Plan, min_improvement: float) -> bool:
    """Whether ``after`` is better than ``before`` for ``goal`` by more than ``min_improvement`` (relative):
    it breaks the constraint by that much less, or as little and its measure is that much lower. Never, with an
    infinite ``min_improvement`` (a static plan, or a replay's given one)."""
    if math.isinf(min_improvement):
        return False
    (broken, measure), (broken_after, measure_after) = (
        goal.plan_key(before.assignments),
        goal.plan_key(after.assignments),
    )
    if broken_after < broken * (1.0 - min_improvement) - 1e-6:
        return True
    return broken_after <= broken + 1e-6 and measure_after < measure * (1.0 - min_improvement) - 1e-9


def repair(previous: Plan, jobs: Sequence[Job], cluster: Cluster, *, busy: Sequence[Reservation] = ()) -> Plan:
    """``previous`` made valid for the current state, changing as little as possible.

    Jobs that were planned keep their node, devices and relative order, with the option of the same strategy and
    device count (now with its corrected runtime); each starts as soon as its devices are free (after ``busy`` and
    its predecessors). Jobs that were not planned, or whose option or devices no longer exist, are appended with
    the earliest-finish rule.
    """
    by_name = {j.name: j for j in jobs}
    free = [[0.0] * n for n in cluster.nodes]
    for r in busy:
        for d in r.devices:
            free[r.node][d] = max(free[r.node][d], float(r.until))
    out: list[Assignment] = []
    placed: set[str] = set()
    for a in sorted(previous.assignments, key=lambda a: (a.start, a.end, a.job)):
        job = by_name.get(a.job)
        if job is None or a.node >= len(cluster.nodes) or any(d >= cluster.nodes[a.node] for d in a.devices):
            continue
        option = _same_option(job, a.option)
        if option is None or option.devices != len(a.devices):
            continue
        start = max(free[a.node][d] for d in a.devices)
        for d in a.devices:
            free[a.node][d] = start + option.runtime
        out.append(Assignment(job.name, option, a.node, a.devices, start, start + option.runtime))
        placed.add(job.name)
    rest = [(j, j.options) for j in jobs if j.name not in placed]
    rest.sort(key=lambda x: (-min(o.runtime for o in x[1]), x[0].name))
    if rest:
        # Append after everything kept: reservations for the kept jobs' device occupancy up to their ends.
        hold = [Reservation(n, (d,), free[n][d]) for n, row in enumerate(free) for d in range(len(row)) if row[d] > 0]
        out += schedule_in_order(rest, cluster, busy=hold)
    return Plan(tuple(sorted(out, key=lambda a: (a.start, a.job))), solver="kept")


def _same_option(job: Job, old: Option) -> Option | None:
    for o in job.options:
        if o.choice == old.choice:
            return o
    return None


def reflow(previous: Plan, jobs: Sequence[Job], cluster: Cluster, *, busy: Sequence[Reservation] = ()) -> Plan:
    """``previous``'s choices placed again on the devices as they are now: each job keeps its option (with its
    corrected runtime) and its order, and takes the devices that free up first. A job it did not plan joins the
    order where longest-first puts it (before the first planned job that runs shorter than its most efficient
    option), with its cheapest options not slower than the plan (as the list scheduler allots them). One
    list-scheduling pass: where a fresh plan is too
    costly to make at every event, this follows the last one while the jobs' true ends drift from it."""
    by_name = {j.name: j for j in jobs}
    order: list[tuple[Job, Sequence[Option]]] = []
    for a in sorted(previous.assignments, key=lambda a: (a.start, a.end, a.job)):
        job = by_name.get(a.job)
        option = _same_option(job, a.option) if job is not None else None
        if job is not None and option is not None and option.devices <= max(cluster.nodes):
            order.append((job, (option,)))
    placed = {job.name for job, _ in order}

    def length(job: Job) -> float:  # its most efficient option's runtime
        return min(job.options, key=lambda o: (o.runtime * o.devices, o.runtime)).runtime

    # the first planned job shorter than a runtime: bisect the running minimum of the planned jobs' runtimes
    shortest_so_far = list(itertools.accumulate((-opts[0].runtime for _, opts in order), max))
    joining: dict[int, list[tuple[Job, Sequence[Option]]]] = {}
    makespan = previous.makespan
    for job in sorted((j for j in jobs if j.name not in placed), key=lambda j: (-length(j), j.name)):
        at = bisect.bisect_right(shortest_so_far, -length(job))
        joining.setdefault(at, []).append((job, allot(job, makespan)))
    if joining:
        order = [entry for at in range(len(order) + 1) for entry in (*joining.get(at, ()), *order[at : at + 1])]
    return Plan(
        tuple(sorted(schedule_in_order(order, cluster, busy=busy), key=lambda a: (a.start, a.job))), solver="kept"
    )
