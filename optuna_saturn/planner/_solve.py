"""``solve``: heuristics first (always a valid plan), then the chosen backend improves it within the time limit (or
the work limit: :mod:`optuna_saturn.planner._work_limit`)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence

from optuna_saturn.planner._baselines import sequential_max, task_parallel
from optuna_saturn.planner._bounds import lower_bound
from optuna_saturn.planner._cpsat import solve_cpsat
from optuna_saturn.planner._goal import MAKESPAN, Goal
from optuna_saturn.planner._greedy import greedy
from optuna_saturn.planner._linear import SolverUnavailable
from optuna_saturn.planner._list import list_schedule
from optuna_saturn.planner._milp import solve_block_milp
from optuna_saturn.planner._options import check_inputs, prune_jobs
from optuna_saturn.planner._search import iterated_list
from optuna_saturn.planner._types import Cluster, Job, Plan, Reservation
from optuna_saturn.planner._validate import plan_problems
from optuna_saturn.planner._work_limit import WorkLimit

_logger = logging.getLogger("optuna_saturn.planner")

SOLVERS = ("auto", "gurobi", "highs", "cpsat", "search", "list", "greedy", "sequential-max", "task-parallel")
_BASELINES = {"sequential-max": sequential_max, "task-parallel": task_parallel}
# Above this many (job, option, block) binaries the block MILP is not worth building; CP-SAT takes over.
_MILP_MAX_VARS = 20_000
# "auto" gives small instances to the MILP first; above this many jobs, to the iterated list search, then CP-SAT.
_AUTO_MILP_JOBS = 60
# Above this many (job, option, node) intervals, "auto" runs the search alone (CP-SAT would not start in time).
_AUTO_CPSAT_INTERVALS = 12_000


def solve(
    jobs: Sequence[Job],
    cluster: Cluster,
    solver: str = "auto",
    time_limit: float = 10.0,
    *,
    busy: Sequence[Reservation] = (),
    seed: int = 0,
    hint: Plan | None = None,
    work_limit: WorkLimit | None = None,
    goal: Goal = MAKESPAN,
) -> Plan:
    """Plan ``jobs`` on ``cluster``, minimising the makespan (or, given a ``goal`` with a deadline or a budget,
    the device-seconds within the deadline, or the makespan within the budget). ``busy`` holds devices already
    taken.

    ``solver`` is one of ``SOLVERS``. Every backend starts from the best heuristic plan (greedy and moldable list
    scheduling), is warm-started with it, and its answer is kept only if it is shorter, so a backend can never
    make the plan worse; the returned plan always passes ``validate``. ``time_limit`` covers the whole call.
    ``hint``, a valid plan of the same jobs (e.g. the previous plan, repaired), joins the warm-start candidates.

    ``work_limit`` replaces ``time_limit`` (which is then ignored) with a budget of work: the backends stop at work
    limits, never at the wall clock, so the same inputs and ``seed`` give the same plan on any machine, however busy
    (what the simulator needs: see :class:`WorkLimit`). It is split between the stages as a time limit is: a
    quarter for the list heuristic; in "auto", 0.4 for the MILP and 0.6 for CP-SAT, or 0.6 for the search and 0.4
    for CP-SAT on more than 60 jobs; all of it for a single backend.

    Under another goal than the makespan (a :class:`Deadline`, a :class:`Budget`), the plan is the best, for the
    goal, of the makespan plan (the earliest end any plan reaches), the moldable list plans weighed by the goal, and
    what the MILP and CP-SAT find with the goal's own constraint and measure in their models (warm-started from the
    best of those); ``plan.info`` says whether it meets the goal (``met``), its device-seconds, its cost, and where
    a deadline is missed, the earliest end. Given a work limit, the exact stages have half of it again between them
    (in "auto", 0.4 of that half for the MILP and 0.6 for CP-SAT; the makespan plan and the list plans take the
    first two halves).
    """
    if not goal.earliest_end:
        return _for_goal(jobs, cluster, solver, time_limit, busy, seed, hint, work_limit, goal)
    t0 = time.perf_counter()
    if solver not in SOLVERS:
        raise ValueError(f"Unknown solver {solver!r}; choose one of {SOLVERS}.")
    check_inputs(jobs, cluster, busy)
    if not jobs:
        return Plan((), solver=solver, lower_bound=0.0)
    if solver in _BASELINES:
        plan = _BASELINES[solver](jobs, cluster, busy=busy)
        return _finish(plan, jobs, cluster, busy, lower_bound(jobs, cluster, busy=busy), t0)

    pruned = prune_jobs(jobs, cluster)
    lb = lower_bound(pruned, cluster, busy=busy)
    plain = greedy(pruned, cluster, busy=busy)
    if solver == "greedy":
        return _finish(plain, jobs, cluster, busy, lb, t0)
    listed = list_schedule(
        pruned,
        cluster,
        busy=busy,
        lower=lb,
        upper=plain.makespan,
        time_limit=max(0.05, 0.25 * time_limit),
        work_limit=None if work_limit is None else WorkLimit(max(0.05, 0.25 * work_limit.units)),
    )
    candidates = [plain, listed]
    if hint is not None and not plan_problems(hint, jobs, cluster, busy=busy):
        candidates.append(hint)
    best = min(candidates, key=lambda p: p.makespan)
    if solver == "list" or best.makespan <= lb * (1 + 1e-9):
        return _finish(best, jobs, cluster, busy, lb, t0)

    def left() -> float:
        return max(0.0, time_limit - (time.perf_counter() - t0))

    intervals = sum(len(j.options) for j in pruned) * len(cluster.nodes)
    # (stage, its share of the time left when it starts, its share of a work limit)
    if solver == "auto":
        if len(jobs) <= _AUTO_MILP_JOBS:
            stages = [(_milp_name(), 0.4, 0.4), ("cpsat", 1.0, 0.6)]
        elif intervals <= _AUTO_CPSAT_INTERVALS:  # the search finds most of the gain; CP-SAT starts from it
            stages = [("search", 0.6, 0.6), ("cpsat", 1.0, 0.4)]
        else:
            stages = [("search", 1.0, 1.0)]
    else:
        stages = [(solver, 1.0, 1.0)]
    notes: dict = {}
    for name, share, work_share in stages:
        if best.makespan <= lb * (1 + 1e-9) or (work_limit is None and left() <= 0.02):
            break
        candidate = _run_backend(
            name,
            pruned,
            cluster,
            busy,
            left() * share if work_limit is None else math.inf,
            seed,
            best,
            lb,
            notes,
            level=logging.WARNING if solver == name else logging.INFO,
            work_limit=None if work_limit is None else work_limit.share(work_share),
        )
        if candidate is not None and candidate.makespan < best.makespan - 1e-9:
            best = candidate
    return _finish(best, jobs, cluster, busy, lb, t0, notes)


def _for_goal(
    jobs: Sequence[Job],
    cluster: Cluster,
    solver: str,
    time_limit: float,
    busy: Sequence[Reservation],
    seed: int,
    hint: Plan | None,
    work_limit: WorkLimit | None,
    goal: Goal,
) -> Plan:
    t0 = time.perf_counter()
    half = None if work_limit is None else work_limit.share(0.5)
    fastest = solve(jobs, cluster, solver, time_limit / 2, busy=busy, seed=seed, hint=hint, work_limit=half)
    if not jobs:
        return fastest
    pruned = prune_jobs(jobs, cluster)
    weighed = list_schedule(
        pruned,
        cluster,
        busy=busy,
        lower=fastest.lower_bound,
        upper=fastest.makespan,
        time_limit=max(0.05, time_limit / 2),
        work_limit=half,
        goal=goal,
    )
    best = min((fastest, weighed), key=lambda p: goal.plan_key(p.assignments))
    notes = dict(fastest.info) if best is fastest else {}  # (the solvers' notes are the makespan plan's own)
    for name, share, work_share in _goal_stages(solver, pruned, cluster):
        left = max(0.0, time_limit - (time.perf_counter() - t0))
        if work_limit is None and left <= 0.02:
            break
        shaped: dict = {}
        candidate = _run_backend(
            name,
            pruned,
            cluster,
            busy,
            left * share if work_limit is None else math.inf,
            seed,
            best,
            fastest.lower_bound,
            shaped,
            level=logging.WARNING if solver == name else logging.INFO,
            work_limit=None if half is None else half.share(work_share),
            goal=goal,
        )
        if candidate is not None and _better(goal.plan_key(candidate.assignments), goal.plan_key(best.assignments)):
            best, notes = candidate, {**candidate.info, **shaped}
    plan = _finish(best, jobs, cluster, busy, fastest.lower_bound, t0, notes)
    plan.info.update(goal.report(plan))
    if not plan.info["met"]:  # (the earliest end of any plan found: the makespan plan's, or a weighed one's)
        plan.info["earliest_end"] = round(min(fastest.makespan, weighed.makespan), 3)
    return plan


def _goal_stages(solver: str, jobs: Sequence[Job], cluster: Cluster) -> list[tuple[str, float, float]]:
    """The exact backends that plan for a goal (stage, its share of the time left, its share of the exact stage's
    work limit: the shares of the work limit add up to 1, as a work limit is not "what is left"): the one asked
    for, or in "auto" those that "auto" would run on an instance this size for the makespan (not the search: it
    knows only the makespan)."""
    if solver in ("gurobi", "highs", "cpsat"):
        return [(solver, 1.0, 1.0)]
    if solver != "auto":
        return []
    intervals = sum(len(j.options) for j in jobs) * len(cluster.nodes)
    milp = len(jobs) <= _AUTO_MILP_JOBS and _block_vars(jobs, cluster) <= _MILP_MAX_VARS
    cpsat = intervals <= _AUTO_CPSAT_INTERVALS
    if milp and cpsat:
        return [(_milp_name(), 0.4, 0.4), ("cpsat", 1.0, 0.6)]
    return [(_milp_name(), 1.0, 1.0)] if milp else [("cpsat", 1.0, 1.0)] if cpsat else []


def _better(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """``a`` is lower than ``b`` by more than rounding, in the first part where they differ by more."""
    for x, y in zip(a, b):
        if x < y - 1e-6 * max(1.0, abs(y)):
            return True
        if x > y + 1e-6 * max(1.0, abs(y)):
            return False
    return False


def _milp_name() -> str:
    try:
        import gurobipy  # noqa: F401
    except ImportError:
        return "highs"
    return "gurobi"


def _run_backend(
    name: str,
    jobs: list[Job],
    cluster: Cluster,
    busy: Sequence[Reservation],
    time_limit: float,
    seed: int,
    hint: Plan,
    lb: float,
    notes: dict,
    level: int = logging.WARNING,
    work_limit: WorkLimit | None = None,
    goal: Goal = MAKESPAN,
) -> Plan | None:
    """Run one backend; on ``SolverUnavailable`` log and fall back (recorded in ``notes``).

    The log line is a WARNING when the user asked for this backend, INFO when "auto" merely tried it.
    """
    notes.setdefault("backends", []).append(name)
    if name == "search":
        return iterated_list(
            jobs,
            cluster,
            start=hint,
            busy=busy,
            time_limit=time_limit,
            seed=seed,
            lower_bound=lb,
            work_limit=work_limit,
        )
    if name == "cpsat":
        return solve_cpsat(
            jobs,
            cluster,
            busy=busy,
            time_limit=time_limit,
            seed=seed,
            hint=hint,
            lower_bound=lb,
            work_limit=work_limit,
            goal=goal,
        )
    try:
        return solve_block_milp(
            jobs,
            cluster,
            backend=name,
            busy=busy,
            time_limit=time_limit,
            seed=seed,
            hint=hint,
            lower_bound=lb,
            work_limit=work_limit,
            goal=goal,
        )
    except SolverUnavailable as e:
        if name != "gurobi":
            _logger.log(level, "%s backend unavailable: %s; keeping the heuristic plan.", name, e)
            notes["fallback"] = f"{name} -> heuristic: {e}"
            return None
        fallback = "highs" if _block_vars(jobs, cluster) <= _MILP_MAX_VARS else "cpsat"
        _logger.log(level, "gurobi backend unavailable: %s; falling back to %r.", e, fallback)
        notes["fallback"] = f"gurobi -> {fallback}: {e}"
        return _run_backend(
            fallback,
            jobs,
            cluster,
            busy,
            time_limit,
            seed,
            hint,
            lb,
            notes,
            level=level,
            work_limit=work_limit,
            goal=goal,
        )


def _block_vars(jobs: Sequence[Job], cluster: Cluster) -> int:
    """Roughly how many binaries the block MILP would have (options times blocks of that size)."""
    return sum(len(j.options) for j in jobs) * sum(cluster.nodes)


def _finish(
    plan: Plan,
    jobs: Sequence[Job],
    cluster: Cluster,
    busy: Sequence[Reservation],
    lb: float,
    t0: float,
    notes: dict | None = None,
) -> Plan:
    problems = plan_problems(plan, jobs, cluster, busy=busy)
    if problems:  # a bug in a backend: never hand out an invalid plan silently
        raise RuntimeError(f"Planner produced an invalid plan ({plan.solver}): {problems[:5]}")
    info = dict(plan.info)
    info.update(notes or {})
    optimal = plan.makespan <= lb * (1 + 1e-9) or bool(info.get("cpsat_optimal") and info.get("exact_grid"))
    out = Plan(
        tuple(sorted(plan.assignments, key=lambda a: (a.start, a.job))),
        solver=plan.solver,
        lower_bound=lb,
        solve_seconds=time.perf_counter() - t0,
        optimal=optimal,
    )
    out.info.update(info)
    return out
