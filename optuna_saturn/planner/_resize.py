"""Elastic resize: whether stopping a running job and restarting it under another option ends the sweep sooner.

Saturn's introspection re-plans only the jobs that have not started. A job that started on one device early in
a sweep may be the one the sweep's tail waits for, while other devices idle: moving it to more devices (or fewer,
to make room) can shorten the makespan, if the job checkpoints. The move costs what the checkpoint and the
restart cost (saving and loading its state, a new process group, the steps since its last checkpoint), so it is
made only when the plan with the move beats the plan without it by more than ``min_improvement``, the cost being
part of the moved job's new runtime. Pure, like the rest of the planner: the caller measures progress and costs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from optuna_saturn.planner._goal import MAKESPAN, Goal
from optuna_saturn.planner._replan import improves, replan
from optuna_saturn.planner._solve import solve
from optuna_saturn.planner._types import Assignment, Cluster, Job, Option, Plan, Reservation
from optuna_saturn.planner._work_limit import WorkLimit


@dataclass(frozen=True)
class Resize:
    """Move ``job`` (running now) by stopping it and planning it again as ``plan`` says; ``makespan`` is that
    plan's end (running jobs included), ``kept_makespan`` the end without the move."""

    job: str
    plan: Plan
    makespan: float
    kept_makespan: float


def remaining_job(
    name: str, options: Sequence[Option], *, current: tuple, left: float, rate: float = 1.0, restart: float = 0.0
) -> Job | None:
    """The rest of a running job as a job to plan: every option but the ``current`` one (its ``choice``), taking
    ``left`` (the fraction of its steps still to run) of its whole runtime, times ``rate`` (its observed step time
    over the estimate), plus ``restart`` seconds. None when no other option exists."""
    rest = [replace(o, runtime=o.runtime * rate * max(left, 0.0) + restart) for o in options if o.choice != current]
    return Job(name, rest) if rest else None


def best_resize(
    jobs: Sequence[Job],
    cluster: Cluster,
    *,
    busy: Sequence[Reservation],
    movable: Mapping[str, Job],
    previous: Plan | None = None,
    solver: str = "list",
    time_limit: float = 0.1,
    min_improvement: float = 0.02,
    min_gain: Mapping[str, float] | None = None,
    seed: int = 0,
    work_limit: WorkLimit | None = None,
    goal: Goal = MAKESPAN,
) -> Resize | None:
    """The one move of a running job (``movable``: the running jobs that checkpoint, each as
    :func:`remaining_job` describes it, named as its ``busy`` reservation) that shortens the plan of ``jobs`` the
    most, or None if none beats keeping every running job where it is by more than ``min_improvement`` and by
    more than ``min_gain[job]`` seconds. Pass the move's restart cost as ``min_gain`` (it is in the moved job's
    runtime already): the plan does not foresee prunes, and a moved trial pruned soon after gains nothing for the
    cost paid; in the simulator (``benchmarks/elastic_resize.py``) that margin turns small losses at high restart
    costs into no moves, and keeps the gains at low ones. ``work_limit`` bounds each of its plans by work instead of
    by ``time_limit`` (see :func:`~optuna_saturn.planner.solve`): the same move on any machine. Under a deadline or
    a budget (``goal``) a move must make the plan better for it (:func:`~optuna_saturn.planner.replan`'s rule:
    closer to the constraint, or within it at a lower measure), the running jobs' remaining device-seconds
    counted."""
    kept = replan(
        previous,
        jobs,
        cluster,
        busy=busy,
        solver=solver,
        time_limit=time_limit,
        seed=seed,
        work_limit=work_limit,
        goal=goal,
    )
    # (the fresh plan without the move, too: re-planning the waiting jobs alone must not count as the move's gain)
    kept_end = max([min(kept.makespan, kept.info.get("fresh_makespan", kept.makespan)), *(r.until for r in busy)])
    best: Resize | None = None
    best_key = (float("inf"), float("inf"))
    for reservation in busy:
        moved = movable.get(reservation.job)
        if moved is None:
            continue
        others = [r for r in busy if r is not reservation]
        plan = solve(
            [*jobs, moved], cluster, solver, time_limit, busy=others, seed=seed, work_limit=work_limit, goal=goal
        )
        end = _end(plan, others)
        if not goal.earliest_end:
            if improves(goal, _with(kept, busy), _with(plan, others), min_improvement) and (
                best is None or goal.plan_key(_with(plan, others).assignments) < best_key
            ):
                best, best_key = (
                    Resize(reservation.job, plan, end, kept_end),
                    goal.plan_key(_with(plan, others).assignments),
                )
            continue
        threshold = min(kept_end * (1.0 - min_improvement), kept_end - (min_gain or {}).get(reservation.job, 0.0))
        if end < threshold - 1e-9 and (best is None or end < best.makespan):
            best = Resize(reservation.job, plan, end, kept_end)
    return best


def _with(plan: Plan, busy: Sequence[Reservation]) -> Plan:
    """``plan`` with the running jobs in ``busy`` as assignments from time 0: their device-seconds count too."""
    running = tuple(
        Assignment(r.job, Option("running", len(r.devices), r.until), r.node, r.devices, 0.0, r.until) for r in busy
    )
    return Plan(running + plan.assignments)


def _end(plan: Plan, busy: Sequence[Reservation]) -> float:
    return max([plan.makespan, *(r.until for r in busy)])
