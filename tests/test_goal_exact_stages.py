"""The exact stages under a goal where the heuristics leave them the hard part: a starting plan over the budget, a
running trial that ends past the deadline, and the work limit they share."""

from __future__ import annotations

import pytest

from optuna_saturn.planner import (
    Budget,
    Cluster,
    Deadline,
    Job,
    Makespan,
    Option,
    Reservation,
    WorkLimit,
    _solve,
    device_seconds,
    solve,
    validate,
)
from optuna_saturn.planner._cpsat import solve_cpsat
from optuna_saturn.planner._milp import solve_block_milp

WORK = WorkLimit(1.0)


def test_cpsat_finds_the_plan_within_a_budget_that_ends_later_than_an_over_budget_start():
    # Three trials on 2 devices: on 1 device for about 600 s or on 2 for 310 s (620 device-seconds). The makespan
    # plan spends more than 1,800; the only plan within the budget (exactly at it: each trial on its single device)
    # ends at 1,800.7 s if run one by one, past a horizon set by the start's end.
    jobs = [Job(f"j{i}", [Option("single", 1, t), Option("ddp", 2, 310.0)]) for i, t in enumerate([600, 601, 599.7])]
    cluster, budget = Cluster([2]), Budget(1800.7)
    start = solve(jobs, cluster, "auto", work_limit=WORK)
    assert budget.problems(start)  # (the case: the starting plan is over the budget)
    plan = solve_cpsat(jobs, cluster, time_limit=10, seed=0, hint=start, work_limit=WORK, goal=budget)
    assert plan is not None
    validate(plan, jobs, cluster, goal=budget)
    assert device_seconds(plan.assignments) == pytest.approx(1800.7)
    assert plan.makespan == pytest.approx(1199.7, rel=1e-3)  # (the two shortest on one device, 601 s on the other)


def test_the_milp_bounds_the_planned_jobs_by_a_deadline_not_a_running_trial_that_ends_past_it():
    # A running trial holds device 0 until 2,000 s; the deadline is 1,000 s. The four waiting trials fit on the
    # other three devices by 800 s: the goal (and CP-SAT) count the plan's jobs, so the MILP must find that too.
    jobs = [Job(f"j{i}", [Option("single", 1, 400.0), Option("ddp", 2, 250.0)]) for i in range(4)]
    cluster, deadline = Cluster([4]), Deadline(1000.0)
    busy = [Reservation(0, (0,), 2000.0, "running")]
    start = solve(jobs, cluster, "list", busy=busy, work_limit=WORK)
    milp = solve_block_milp(
        jobs, cluster, backend="highs", busy=busy, time_limit=10, seed=0, hint=start, lower_bound=0.0, goal=deadline
    )
    cpsat = solve_cpsat(jobs, cluster, busy=busy, time_limit=10, seed=0, hint=start, work_limit=WORK, goal=deadline)
    assert milp is not None and cpsat is not None
    validate(milp, jobs, cluster, busy=busy, goal=deadline)
    assert all(0 not in a.devices for a in milp.assignments)  # (nothing waits for the running trial)
    assert device_seconds(milp.assignments) == pytest.approx(device_seconds(cpsat.assignments)) == 1600.0


def test_under_a_goal_the_stages_of_auto_share_one_and_a_half_times_the_work_limit(monkeypatch):
    """The docstring's bound: the makespan plan has half the limit, the goal's list plans half, and the exact
    stages (the MILP and CP-SAT, in "auto" on a small instance) the last half between them."""
    handed: list[tuple[str, float]] = []
    solve_for_makespan, weigh, run_backend = _solve.solve, _solve.list_schedule, _solve._run_backend

    def makespan_plan(*args, **kwargs):
        if isinstance(kwargs.get("goal", Makespan()), Makespan):
            handed.append(("makespan plan", kwargs["work_limit"].units))
        return solve_for_makespan(*args, **kwargs)

    def weighed(*args, **kwargs):
        if not isinstance(kwargs.get("goal", Makespan()), Makespan):
            handed.append(("list", kwargs["work_limit"].units))
        return weigh(*args, **kwargs)

    def exact(name, *args, **kwargs):
        if not isinstance(kwargs.get("goal", Makespan()), Makespan):
            handed.append((name, kwargs["work_limit"].units))
        return run_backend(name, *args, **kwargs)

    monkeypatch.setattr(_solve, "solve", makespan_plan)
    monkeypatch.setattr(_solve, "list_schedule", weighed)
    monkeypatch.setattr(_solve, "_run_backend", exact)
    monkeypatch.setattr(_solve, "_milp_name", lambda: "highs")
    jobs = [Job(f"j{i}", [Option("single", 1, 300.0 + 10 * i), Option("ddp", 2, 170.0 + 5 * i)]) for i in range(6)]
    solve_for_makespan(jobs, Cluster([4]), "auto", work_limit=WorkLimit(2.0), goal=Deadline(2000.0))
    assert [name for name, _ in handed] == ["makespan plan", "list", "highs", "cpsat"]
    assert sum(units for _, units in handed) == pytest.approx(1.5 * 2.0)
