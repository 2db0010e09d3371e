"""Simulator tests: exact replay without noise, valid executions with noise and prunes, re-planning sanity."""

from __future__ import annotations

import random

import pytest

from optuna_saturn.planner import Assignment, Cluster, Job, Option, Plan, solve, validate
from optuna_saturn.simulator import simulate

try:
    from test_planner import random_jobs
except ImportError:  # tests/ imported as a package
    from tests.test_planner import random_jobs


def noisy(jobs: list[Job], seed: int, *, spread: float = 0.2, prune_rate: float = 0.3):
    rng = random.Random(seed)
    noise = {j.name: rng.uniform(1 - spread, 1 + spread) for j in jobs}
    prunes = {j.name: rng.uniform(0.1, 0.6) for j in jobs if rng.random() < prune_rate}
    return noise, prunes


def executed_as_plan(result, jobs: list[Job]) -> tuple[Plan, list[Job]]:
    """The executed schedule as a plan over jobs whose only option is what really ran (for ``validate``)."""
    assignments, truth = [], []
    for a in result.executed:
        real = Option(a.option.strategy, a.option.devices, a.end - a.start)
        assignments.append(a.__class__(a.job, real, a.node, a.devices, a.start, a.end))
        truth.append(Job(a.job, [real]))
    return Plan(tuple(assignments)), truth


@pytest.mark.parametrize("cluster", [Cluster([8]), Cluster([8, 4])])
def test_without_noise_the_simulation_replays_the_plan(cluster: Cluster) -> None:
    jobs = random_jobs(14, 31)
    for solver in ("auto", "list", "sequential-max", "task-parallel"):
        plan = solve(jobs, cluster, solver, time_limit=0.5)
        result = simulate(jobs, cluster, plan=plan)
        assert result.makespan == pytest.approx(plan.makespan, rel=1e-9)
        assert {(a.job, a.node, a.devices, round(a.start, 6)) for a in result.executed} == \
            {(a.job, a.node, a.devices, round(a.start, 6)) for a in plan.assignments}
        work = sum(a.option.devices * a.option.runtime for a in plan.assignments)
        assert result.utilisation == pytest.approx(work / (cluster.total_devices * plan.makespan))


@pytest.mark.parametrize("mode", ["static", "replan", "clairvoyant"])
def test_noisy_executions_are_valid_and_use_true_runtimes(mode: str) -> None:
    jobs, cluster = random_jobs(12, 32), Cluster([8, 4])
    noise, prunes = noisy(jobs, 1)
    result = simulate(jobs, cluster, noise=noise, prune_at=prunes, mode=mode, time_limit=0.2)
    plan, truth = executed_as_plan(result, jobs)
    validate(plan, truth, cluster)
    for a in result.executed:
        assert a.end - a.start == pytest.approx(a.option.runtime * noise[a.job] * prunes.get(a.job, 1.0))
    if mode == "replan":
        assert result.replans >= 1


def test_clairvoyant_mode_matches_its_own_plan() -> None:
    jobs, cluster = random_jobs(12, 33), Cluster([8])
    noise, prunes = noisy(jobs, 2)
    result = simulate(jobs, cluster, noise=noise, prune_at=prunes, mode="clairvoyant", time_limit=0.5)
    assert result.makespan == pytest.approx(result.planned_makespan)


@pytest.mark.parametrize("seed", range(3))
def test_replanning_never_makes_the_clairvoyant_case_worse(seed: int) -> None:
    # Truth == estimates: the static plan is the clairvoyant one; re-planning may only keep or improve it.
    jobs, cluster = random_jobs(12, 40 + seed), Cluster([8])
    plan = solve(jobs, cluster, "list")  # a deliberately improvable starting plan
    static = simulate(jobs, cluster, plan=plan)
    replanned = simulate(jobs, cluster, plan=plan, mode="replan", time_limit=0.3)
    assert replanned.makespan <= static.makespan + 1e-6


def test_replanning_recovers_from_prunes() -> None:
    # Many prunes free devices early; a static plan cannot move later trials onto them, re-planning can.
    jobs, cluster = random_jobs(16, 50), Cluster([8])
    wins = 0
    for seed in range(3):
        noise, prunes = noisy(jobs, seed, prune_rate=0.5)
        static = simulate(jobs, cluster, noise=noise, prune_at=prunes, time_limit=0.3)
        replanned = simulate(jobs, cluster, noise=noise, prune_at=prunes, mode="replan", time_limit=0.3)
        wins += replanned.makespan < static.makespan - 1e-6
    assert wins >= 2


def test_replanning_holds_a_slow_running_trial_for_its_observed_remaining_time() -> None:
    """Trial A runs twice as slow as estimated. At t=15 it is still running; assumed on time it would look done,
    and D would stay queued behind it on its device; at its observed step rate D moves to the free device."""
    a, b, c, d = jobs = [Job(n, [Option("single", 1, t)]) for n, t in (("A", 10), ("B", 5), ("C", 10), ("D", 10))]
    cluster = Cluster([2])
    plan = Plan((_at(a, 0, start=0), _at(b, 1, start=0), _at(c, 1, start=5), _at(d, 0, start=10)))
    validate(plan, jobs, cluster)
    runs = {
        observed: simulate(jobs, cluster, noise={"A": 2.0}, mode="replan", plan=plan, solver="cpsat", time_limit=1.0,
                           observe_step_rate=observed)
        for observed in (False, True)
    }
    assert runs[False].makespan == pytest.approx(30.0)  # D waited for A on device 0
    assert runs[True].makespan == pytest.approx(25.0)  # D ran on device 1 after C
    assert {a.job: a.devices for a in runs[True].executed}["D"] == (1,)


def _at(job: Job, device: int, *, start: float) -> Assignment:
    (option,) = job.options
    return Assignment(job.name, option, 0, (device,), start, start + option.runtime)
