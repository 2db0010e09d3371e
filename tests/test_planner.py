"""Planner tests: validity on every backend, exactness on known optima, bounds, fallback, determinism, re-planning.

Kept fast: small instances, time limits of a fraction of a second, one solver thread.
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
import random

import pytest
from support import require

from optuna_saturn.planner import (
    SOLVERS,
    Assignment,
    Cluster,
    Job,
    Option,
    Plan,
    Reservation,
    lower_bound,
    plan_problems,
    prune_options,
    replan,
    solve,
    validate,
)
from optuna_saturn.planner._cpsat import solve_cpsat
from optuna_saturn.planner._greedy import greedy
from optuna_saturn.planner._milp import solve_block_milp

STRATEGIES = {1: "single", 2: "ddp", 4: "fsdp", 8: "fsdp"}


def random_jobs(n: int, seed: int, *, max_devices: int = 8, integer: bool = False) -> list[Job]:
    """Jobs with 1-4 options; more devices are faster but less efficient, as in real data-parallel training."""
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        base = rng.uniform(20, 200)
        options = []
        for d in (1, 2, 4, 8):
            if d > max_devices or (d > 1 and rng.random() < 0.3):
                continue
            eff = rng.uniform(0.6, 1.0) ** (d.bit_length() - 1)
            runtime = base / (d * eff)
            options.append(Option(STRATEGIES[d], d, float(round(runtime)) if integer else runtime))
        if rng.random() < 0.2:  # some trials do not fit on one device
            options = [o for o in options if o.devices > 1] or options
        jobs.append(Job(f"t{i}", options))
    return jobs


INSTANCES = {
    "one-node": (random_jobs(14, 1), Cluster([8]), ()),
    "multi-node": (random_jobs(18, 2), Cluster([8, 8, 4]), ()),
    "busy": (
        random_jobs(12, 3),
        Cluster([8, 4]),
        (Reservation(0, (0, 3, 5), 50.0, "r0"), Reservation(1, (1,), 120.0, "r1")),
    ),
}


# --- validity --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("instance", sorted(INSTANCES))
def test_every_backend_returns_valid_plans(solver: str, instance: str) -> None:
    jobs, cluster, busy = INSTANCES[instance]
    plan = solve(jobs, cluster, solver, time_limit=0.4, busy=busy)
    validate(plan, jobs, cluster, busy=busy)
    assert {a.job for a in plan.assignments} == {j.name for j in jobs}
    assert plan.makespan >= plan.lower_bound - 1e-6
    if busy:  # nobody may start on a reserved device before it frees
        for a in plan.assignments:
            for r in busy:
                if r.node == a.node and set(r.devices) & set(a.devices):
                    assert a.start >= r.until - 1e-6


def test_non_power_of_two_nodes_and_options() -> None:
    rng = random.Random(7)
    jobs = [Job(f"j{i}", [Option("a", d, rng.uniform(5, 50)) for d in rng.sample([1, 3, 5, 6], 2)]) for i in range(10)]
    cluster = Cluster([6, 5])
    for solver in ("gurobi", "highs", "cpsat", "auto"):
        validate(solve(jobs, cluster, solver, time_limit=0.3), jobs, cluster)


def test_validate_catches_every_kind_of_mistake() -> None:
    jobs = [Job("a", [Option("ddp", 2, 10.0)]), Job("b", [Option("single", 1, 5.0)])]
    cluster = Cluster([4])
    good = Plan(
        (
            Assignment("a", jobs[0].options[0], 0, (0, 1), 0.0, 10.0),
            Assignment("b", jobs[1].options[0], 0, (2,), 0.0, 5.0),
        )
    )
    validate(good, jobs, cluster)
    a, b = good.assignments
    bad_plans = {
        "overlap": (a, Assignment("b", b.option, 0, (1,), 3.0, 8.0)),
        "missing": (a,),
        "twice": (a, b, b),
        "foreign option": (a, Assignment("b", Option("single", 1, 4.0), 0, (2,), 0.0, 4.0)),
        "wrong device count": (Assignment("a", a.option, 0, (0,), 0.0, 10.0), b),
        "repeated device": (Assignment("a", a.option, 0, (0, 0), 0.0, 10.0), b),
        "no such device": (Assignment("a", a.option, 0, (3, 4), 0.0, 10.0), b),
        "no such node": (a, Assignment("b", b.option, 1, (0,), 0.0, 5.0)),
        "wrong duration": (a, Assignment("b", b.option, 0, (2,), 0.0, 6.0)),
        "negative start": (a, Assignment("b", b.option, 0, (2,), -1.0, 4.0)),
    }
    for what, assignments in bad_plans.items():
        with pytest.raises(ValueError):
            validate(Plan(assignments), jobs, cluster)
        assert plan_problems(Plan(assignments), jobs, cluster), what
    with pytest.raises(ValueError, match="reservation"):
        validate(good, jobs, cluster, busy=[Reservation(0, (2,), 1.0, "running")])


def test_dominated_options_are_pruned() -> None:
    opts = [
        Option("fsdp", 4, 10.0),
        Option("ddp", 4, 12.0),
        Option("zero3", 8, 11.0),
        Option("single", 1, 30.0),
        Option("zero2", 16, 1.0),
    ]
    kept = prune_options(opts, max_devices=8)
    assert kept == (Option("single", 1, 30.0), Option("fsdp", 4, 10.0))


def test_input_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="unique"):
        solve([Job("a", [Option("s", 1, 1.0)])] * 2, Cluster([1]))
    with pytest.raises(ValueError, match="fits"):
        solve([Job("a", [Option("s", 4, 1.0)])], Cluster([2, 2]))
    with pytest.raises(ValueError, match="solver"):
        solve([Job("a", [Option("s", 1, 1.0)])], Cluster([1]), solver="magic")


# --- exactness and bounds --------------------------------------------------------------------------------------


def tiling_instance() -> tuple[list[Job], Cluster, float]:
    """Rigid pieces that tile an 8 x 10 rectangle exactly (optimum 10 = area bound), each also offered in a
    faster but wasteful variant with twice the devices, which lures earliest-finish greedy away from the tiling."""
    pieces = [(4, 6), (4, 4), (2, 10), (2, 5), (1, 5), (1, 5)]  # 24+16+20+10+5+5 = 80
    jobs = []
    for i, (d, r) in enumerate(pieces):
        options = [Option("fsdp", d, float(r))]
        if 2 * d <= 8:
            options.append(Option("ddp", 2 * d, float(max(1, round(r * 0.6)))))
        jobs.append(Job(f"p{i}", options))
    return jobs, Cluster([8]), 10.0


def test_tiling_optimum_is_reached_by_exact_backends() -> None:
    jobs, cluster, optimum = tiling_instance()
    assert lower_bound(jobs, cluster) == pytest.approx(optimum)
    start = greedy(jobs, cluster)
    assert start.makespan > optimum + 0.5  # the warm start is not already optimal
    cp = solve_cpsat(jobs, cluster, time_limit=5.0, seed=0, hint=start)
    assert cp is not None and cp.makespan == pytest.approx(optimum)
    validate(cp, jobs, cluster)
    for backend in ("gurobi", "highs"):
        plan = solve_block_milp(jobs, cluster, backend=backend, time_limit=5.0, seed=0, hint=None, lower_bound=0.0)
        assert plan is not None and plan.makespan == pytest.approx(optimum), backend
        validate(plan, jobs, cluster)
    for solver in ("auto", "cpsat", "gurobi", "highs"):
        plan = solve(jobs, cluster, solver, time_limit=5.0)
        assert plan.makespan == pytest.approx(optimum) and plan.optimal


def brute_force_optimum(jobs: list[Job], cluster: Cluster) -> float:
    """Exact optimum by the serial schedule-generation scheme over every order, option and node.

    Serial SGS generates every active schedule, and some active schedule is optimal for the makespan; devices in
    a node are interchangeable, so a per-node count (cumulative) is the whole constraint.
    """
    best = float("inf")
    choices = [[(o, n) for o in j.options for n, size in enumerate(cluster.nodes) if o.devices <= size] for j in jobs]
    for order in itertools.permutations(range(len(jobs))):
        for pick in itertools.product(*(choices[j] for j in order)):
            placed: list[list[tuple[float, float, int]]] = [[] for _ in cluster.nodes]
            ms = 0.0
            for o, n in pick:
                cands = sorted({0.0} | {e for _, e, _ in placed[n]})
                for t in cands:
                    points = [t] + [s for s, _, _ in placed[n] if t < s < t + o.runtime]
                    if all(
                        sum(d for s, e, d in placed[n] if s <= p < e) + o.devices <= cluster.nodes[n] for p in points
                    ):
                        break
                placed[n].append((t, t + o.runtime, o.devices))
                ms = max(ms, t + o.runtime)
                if ms >= best:
                    break
            best = min(best, ms)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_lower_bound_never_exceeds_the_exact_optimum(seed: int) -> None:
    rng = random.Random(100 + seed)
    cluster = Cluster([4]) if seed % 2 == 0 else Cluster([4, 2])
    jobs = []
    for i in range(4 if len(cluster.nodes) > 1 else 5):
        base = rng.randint(4, 20)
        opts = [Option("single", 1, float(base))]
        for d in (2, 4):
            if rng.random() < 0.7:
                opts.append(Option(STRATEGIES[d], d, float(max(1, round(base / d * rng.uniform(1.0, 1.6))))))
        if rng.random() < 0.3:
            opts = opts[1:] or opts
        jobs.append(Job(f"j{i}", opts))
    optimum = brute_force_optimum(jobs, cluster)
    lb = lower_bound(jobs, cluster)
    assert lb <= optimum + 1e-9
    # The bound is at least the classic one from DESIGN.md.
    classic = max(
        max(min(o.runtime for o in j.options) for j in jobs),
        sum(min(o.devices * o.runtime for o in j.options) for j in jobs) / cluster.total_devices,
    )
    assert lb >= classic - 1e-9
    plan = solve(jobs, cluster, "cpsat", time_limit=5.0)
    assert plan.makespan == pytest.approx(optimum)  # integer runtimes: CP-SAT is exact here


def test_lower_bound_uses_big_jobs_and_node_sizes() -> None:
    # Three jobs that each need 5 of 8 devices cannot overlap: the bound is their summed runtime, not the area.
    jobs = [Job(f"b{i}", [Option("fsdp", 5, 10.0)]) for i in range(3)]
    assert lower_bound(jobs, Cluster([8])) == pytest.approx(30.0)
    assert solve(jobs, Cluster([8]), "cpsat", time_limit=2).makespan == pytest.approx(30.0)
    # Jobs needing 8 devices cannot use the 4-device node: only the 8-device node's area counts.
    jobs = [Job(f"w{i}", [Option("fsdp", 8, 10.0)]) for i in range(2)] + [Job("s", [Option("single", 1, 1.0)])]
    assert lower_bound(jobs, Cluster([8, 4])) == pytest.approx(20.0)
    # Moldable: a job may not use an option slower than the makespan, so its area is at least that option's.
    # Two such jobs: below T=100 both must take the 8-device option (area 320 / 8 devices = 40), the optimum.
    jobs = [Job(f"m{i}", [Option("single", 1, 100.0), Option("fsdp", 8, 20.0)]) for i in range(2)]
    assert lower_bound(jobs, Cluster([8])) == pytest.approx(40.0)


def test_lower_bound_with_busy_reservations() -> None:
    jobs = [Job("a", [Option("fsdp", 8, 10.0)])]
    assert lower_bound(jobs, Cluster([8]), busy=[Reservation(0, (0,), 5.0)]) >= 10.0 + 5.0 / 8 - 1e-9


# --- Gurobi licence fallback --------------------------------------------------------------------------------------


def _gurobi_is_size_limited() -> bool:
    require(importlib.util.find_spec("gurobipy") is not None, "gurobipy", fix="pip install -e '.[dev]'")
    import gurobipy as gp

    env = gp.Env(empty=True)
    env.setParam("OutputFlag", 0)
    env.start()
    m = gp.Model(env=env)
    m.addVars(2001)
    try:
        m.optimize()
    except gp.GurobiError as e:
        return e.errno == 10010
    return False


def test_gurobi_size_limit_falls_back_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    require(
        _gurobi_is_size_limited(),
        "Gurobi's bundled, size-limited licence (this one solves any size)",
        fix="run the test where gurobipy has its pip-installed licence",
    )
    jobs = random_jobs(240, 11)  # ~240 jobs x pruned options x blocks: over 2000 variables
    cluster = Cluster([8])
    assert solve(jobs, cluster, "list").makespan > lower_bound(jobs, cluster) * (1 + 1e-6)  # backend must run
    with caplog.at_level(logging.WARNING, logger="optuna_saturn.planner"):
        plan = solve(jobs, cluster, "gurobi", time_limit=1.5)
    validate(plan, jobs, cluster)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("10010" in r.getMessage() and "falling back" in r.getMessage() for r in warnings)
    assert plan.info["fallback"].startswith("gurobi -> ")
    assert plan.info["backends"][0] == "gurobi" and len(plan.info["backends"]) == 2


# --- determinism, improvement ------------------------------------------------------------------------------------


@pytest.mark.parametrize("solver", ["auto", "cpsat", "highs", "gurobi", "list"])
def test_same_seed_same_plan(solver: str) -> None:
    jobs, cluster = random_jobs(10, 5, integer=True), Cluster([8])
    first = solve(jobs, cluster, solver, time_limit=3.0, seed=3)
    second = solve(jobs, cluster, solver, time_limit=3.0, seed=3)
    assert first.assignments == second.assignments


def test_backends_never_worse_than_heuristics() -> None:
    jobs, cluster = random_jobs(20, 9), Cluster([8, 8])
    heuristic = solve(jobs, cluster, "list")
    for solver in ("auto", "cpsat", "highs", "gurobi"):
        assert solve(jobs, cluster, solver, time_limit=0.5).makespan <= heuristic.makespan + 1e-9


def test_iterated_search_is_valid_and_never_worse_than_list_scheduling() -> None:
    jobs, cluster = random_jobs(80, 11), Cluster([8, 8, 4])
    start = solve(jobs, cluster, "list")
    plan = solve(jobs, cluster, "search", time_limit=1.0, seed=2)
    validate(plan, jobs, cluster)
    assert plan.makespan <= start.makespan + 1e-9
    assert plan.info["backends"] == ["search"]


def test_solver_beats_baselines_on_moldable_jobs() -> None:
    jobs, cluster = random_jobs(16, 4), Cluster([8])
    planned = solve(jobs, cluster, "auto", time_limit=1.0).makespan
    assert planned < solve(jobs, cluster, "sequential-max").makespan
    assert planned < solve(jobs, cluster, "task-parallel").makespan


def test_baselines_do_what_they_say() -> None:
    jobs = [
        Job("a", [Option("single", 1, 40.0), Option("fsdp", 8, 8.0), Option("zero3", 8, 7.0)]),
        Job("b", [Option("ddp", 2, 30.0), Option("fsdp", 4, 20.0)]),
    ]
    cluster = Cluster([8])
    seq = solve(jobs, cluster, "sequential-max")
    assert seq.for_job("a").option.strategy == "fsdp" and seq.for_job("a").option.devices == 8
    assert seq.for_job("b").option == Option("fsdp", 4, 20.0)
    assert seq.makespan == pytest.approx(28.0)  # one after another
    tp = solve(jobs, cluster, "task-parallel")
    assert tp.for_job("a").option == Option("single", 1, 40.0)
    assert tp.for_job("b").option == Option("ddp", 2, 30.0)  # no single-device option: fewest devices
    assert tp.makespan == pytest.approx(40.0)


# --- re-planning --------------------------------------------------------------------------------------------------


def test_replan_keeps_the_previous_plan_when_gain_is_small() -> None:
    jobs, cluster = random_jobs(12, 21), Cluster([8])
    previous = solve(jobs, cluster, "auto", time_limit=1.0)
    again = replan(previous, jobs, cluster, time_limit=1.0, min_improvement=0.05)
    assert again.info["replan"] == "kept"
    assert [(a.job, a.option, a.node, a.devices) for a in again.assignments] == [
        (a.job, a.option, a.node, a.devices) for a in previous.assignments
    ]
    assert again.makespan == pytest.approx(previous.makespan)


def test_replan_replaces_a_clearly_worse_plan_but_respects_the_margin() -> None:
    jobs, cluster = random_jobs(12, 22), Cluster([8])
    bad = solve(jobs, cluster, "sequential-max")
    better = replan(bad, jobs, cluster, time_limit=1.0, min_improvement=0.05)
    assert better.info["replan"] == "replaced" and better.makespan < 0.95 * bad.makespan
    validate(better, jobs, cluster)
    stubborn = replan(bad, jobs, cluster, time_limit=1.0, min_improvement=0.99)
    assert stubborn.info["replan"] == "kept" and stubborn.makespan == pytest.approx(bad.makespan)


def test_replan_with_running_trials_corrected_runtimes_and_new_arrivals() -> None:
    jobs, cluster = random_jobs(10, 23), Cluster([8, 4])
    previous = solve(jobs, cluster, "auto", time_limit=0.5)
    # Two trials started and are running; one runs 50% longer than estimated; a new trial arrives.
    first = sorted(previous.assignments, key=lambda a: a.start)[:2]
    busy = [Reservation(a.node, a.devices, a.option.runtime * 0.5, a.job) for a in first]
    running = {a.job for a in first}
    pending = [
        Job(
            j.name,
            [Option(o.strategy, o.devices, o.runtime * (1.5 if j.name == jobs[-1].name else 1.0)) for o in j.options],
        )
        for j in jobs
        if j.name not in running
    ]
    pending.append(Job("new", [Option("single", 1, 30.0), Option("ddp", 2, 18.0)]))
    for margin in (0.0, 0.5):
        plan = replan(previous, pending, cluster, busy=busy, time_limit=0.5, min_improvement=margin)
        validate(plan, pending, cluster, busy=busy)
        assert plan.info["replan"] in ("kept", "replaced")
    assert replan(None, pending, cluster, busy=busy, time_limit=0.3).info["replan"] == "fresh"
