"""OR-Tools CP-SAT backend: optional intervals per (job, option, node), one cumulative per node.

Why: a cumulative constraint states "devices in a node are interchangeable" directly, so the model is exact for
the SPASE problem (up to the integer time grid) and has no device symmetry; concrete devices are assigned
afterwards by a sweep (``_devices.assign_devices``), which always succeeds under the cumulative constraint.
Times are scaled to integers: durations are rounded up, so a schedule valid on the grid stays valid with the true
runtimes, then ``compact`` pulls jobs back to the earliest time their devices allow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from optuna_saturn.planner._devices import assign_devices, compact
from optuna_saturn.planner._goal import MAKESPAN, Goal
from optuna_saturn.planner._types import Cluster, Job, Option, Plan, Reservation
from optuna_saturn.planner._work_limit import WorkLimit

_RESOLUTION = 20_000  # grid steps across the hint's makespan; rounding costs at most ~1/20000 per job


def solve_cpsat(
    jobs: Sequence[Job],
    cluster: Cluster,
    *,
    busy: Sequence[Reservation] = (),
    time_limit: float,
    seed: int,
    hint: Plan,
    lower_bound: float = 0.0,
    workers: int = 1,
    work_limit: WorkLimit | None = None,
    goal: Goal = MAKESPAN,
) -> Plan | None:
    """Improve on ``hint`` (a valid plan) for ``goal`` within ``time_limit``; None if CP-SAT found nothing (or
    nothing that meets the goal's constraint).

    ``workers=1`` (the default) makes a run reproducible for a given ``seed`` whenever it ends before the time
    limit; more workers search faster but are not deterministic. Given ``work_limit``, CP-SAT stops at its
    deterministic time instead of the wall clock, on one worker, so the same inputs and ``seed`` give the same plan
    on any machine (``workers`` is then ignored: several workers are deterministic only in CP-SAT's interleaved
    search, which this backend does not set up).
    """
    try:
        from ortools.sat.python import cp_model
    except ImportError:  # pragma: no cover
        return None
    if not jobs:
        return hint
    # (a deadline's or a budget's plans may end later than the hint)
    reach = goal.latest_end(hint.makespan, cheapest_end=_cheapest_serial_end(jobs, cluster, busy))
    unit = _unit(jobs, busy, reach)

    def ticks(t: float) -> int:
        return math.ceil(t / unit - 1e-9)

    # Hint on the grid: keep the hint's devices and per-device order, start each job when its devices free up.
    hint_start: dict[str, int] = {}
    free: dict[tuple[int, int], int] = {}
    for r in busy:
        for d in r.devices:
            free[(r.node, d)] = max(free.get((r.node, d), 0), ticks(r.until))
    for a in sorted(hint.assignments, key=lambda a: (a.start, a.job)):
        s = max(free.get((a.node, d), 0) for d in a.devices)
        hint_start[a.job] = s
        for d in a.devices:
            free[(a.node, d)] = s + ticks(a.option.runtime)
    horizon = max([*free.values(), ticks(reach)], default=0) + 1
    hint_choice = {a.job: (a.option, a.node) for a in hint.assignments}

    m = cp_model.CpModel()
    makespan = m.new_int_var(min(math.floor(lower_bound / unit), horizon), horizon, "makespan")
    per_node: list[tuple[list, list]] = [([], []) for _ in cluster.nodes]
    for r in busy:
        if r.until > 0 and r.devices:
            per_node[r.node][0].append(m.new_fixed_size_interval_var(0, ticks(r.until), f"busy_{r.job}"))
            per_node[r.node][1].append(len(r.devices))
    choices: list[tuple[str, Option, int, Any, Any]] = []  # (job, option, node, its literal, the job's start)
    spent: list[tuple[Any, float]] = []  # (a literal, the device-seconds its option holds)
    least = 0.0  # the device-seconds of the cheapest plan
    for j, job in enumerate(jobs):
        start = m.new_int_var(0, horizon, f"s{j}")
        m.add_hint(start, hint_start[job.name])
        lits = []
        for option in job.options:
            dur = ticks(option.runtime)
            if dur > horizon:
                continue
            for node, size in enumerate(cluster.nodes):
                if option.devices > size:
                    continue
                lit = m.new_bool_var(f"p{j}_{option.strategy}_{option.devices}_{node}")
                iv = m.new_optional_fixed_size_interval_var(start, dur, lit, f"i{j}")
                per_node[node][0].append(iv)
                per_node[node][1].append(option.devices)
                m.add(makespan >= start + dur).only_enforce_if(lit)
                m.add_hint(lit, hint_choice[job.name] == (option, node))
                lits.append(lit)
                spent.append((lit, option.devices * option.runtime))
                choices.append((job.name, option, node, lit, start))
        m.add_exactly_one(lits)
        least += min(s for _, s in spent[-len(lits) :]) if lits else 0.0
    for node, (intervals, demands) in enumerate(per_node):
        if intervals:
            m.add_cumulative(intervals, demands, cluster.nodes[node])
    goal.shape(_CpTerms(m, makespan, unit, spent, least, len(jobs)))

    solver = cp_model.CpSolver()
    p = solver.parameters
    if work_limit is None:
        p.max_time_in_seconds = max(time_limit, 0.01)
        p.num_workers = workers
    else:  # (no wall-clock limit at all: one that bound would make the plan depend on the machine again)
        p.max_deterministic_time = max(work_limit.cpsat_seconds, 1e-4)
        p.num_workers = 1
    p.random_seed = seed
    p.log_search_progress = False
    status = solver.solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    items = [
        (name, option, node, solver.value(start) * unit)
        for name, option, node, lit, start in choices
        if solver.boolean_value(lit)
    ]
    assignments = compact(assign_devices(items, cluster, busy=busy), cluster, busy=busy)
    plan = Plan(tuple(sorted(assignments, key=lambda a: (a.start, a.job))), solver="cpsat")
    plan.info.update(
        cpsat_optimal=status == cp_model.OPTIMAL,
        exact_grid=unit == 1.0,
        cpsat_bound=solver.best_objective_bound * unit,
        grid=unit,
    )
    return plan


class _CpTerms:
    """The CP-SAT model as a goal shapes it (:class:`~optuna_saturn.planner.GoalModel`). Device-seconds are counted
    in whole steps, each option's rounded up; a limit allows one step more per job, so that a plan exactly at it
    (the cheapest plan at a budget of its spend) stays in. A step is a ten-millionth of the cheapest plan's spend
    per job: a plan within the steps is within the limit to a ten-millionth of the least any plan spends (the
    goal's own tolerance is a millionth)."""

    def __init__(self, m: Any, makespan: Any, unit: float, spent: list[tuple[Any, float]], least: float, jobs: int):
        self._m, self._makespan, self._unit, self._jobs = m, makespan, unit, jobs
        self._step = max(least / max(jobs, 1), 1e-9) / 10_000_000
        self._spent = [(lit, math.ceil(s / self._step - 1e-9)) for lit, s in spent]

    def _sum(self) -> Any:
        return sum(lit * steps for lit, steps in self._spent)

    def limit_end(self, seconds: float) -> None:
        self._m.add(self._makespan <= math.floor(seconds / self._unit + 1e-9))

    def limit_spent(self, device_seconds: float) -> None:
        self._m.add(self._sum() <= math.floor(device_seconds / self._step + 1e-9) + self._jobs)

    def minimise_end(self) -> None:
        self._m.minimize(self._makespan)

    def minimise_spent(self) -> None:
        self._m.minimize(self._sum())


def _cheapest_serial_end(jobs: Sequence[Job], cluster: Cluster, busy: Sequence[Reservation]) -> float:
    """Where the plan of each job's cheapest option (fewest device-seconds, then the shortest) ends when its jobs run
    one after another once every busy device is free: a valid plan, so the end no plan of the least spend passes."""
    largest = max(cluster.nodes, default=0)
    start = max((float(r.until) for r in busy), default=0.0)
    fits = [[o for o in j.options if o.devices <= largest] for j in jobs]
    return start + sum(min(opts, key=lambda o: (o.devices * o.runtime, o.runtime)).runtime for opts in fits if opts)


def _unit(jobs: Sequence[Job], busy: Sequence[Reservation], horizon: float) -> float:
    """1 second when every time is a whole number of seconds and the horizon is small; else a fine grid."""
    times = [o.runtime for j in jobs for o in j.options] + [float(r.until) for r in busy]
    if horizon <= 10 * _RESOLUTION and all(abs(t - round(t)) < 1e-9 for t in times):
        return 1.0
    return max(horizon, 1e-9) / _RESOLUTION
