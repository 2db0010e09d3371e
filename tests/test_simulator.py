"""Simulator tests (the real loop on a simulated pool): replays of a plan without noise, valid executions with noise
and prunes, re-planning sanity."""

from __future__ import annotations

import random

import pytest

from optuna_saturn.planner import Cluster, Job, Option, Plan, solve, validate
from optuna_saturn.simulation.simulator import simulate

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
def test_without_noise_a_static_replay_of_a_plan_ends_no_later_than_the_plan(cluster: Cluster) -> None:
    """The loop keeps each trial where the plan put it; its dispatcher may only start a trial earlier, where that
    delays no other trial (before, an early start took devices a later trial was planned on: 242.9 s against
    the plan's 230.7 s, on the first of these cases)."""
    jobs = random_jobs(14, 31)
    for solver in ("auto", "list", "sequential-max", "task-parallel"):
        plan = solve(jobs, cluster, solver, time_limit=0.5)
        result = simulate(jobs, cluster, plan=plan)
        assert result.makespan <= plan.makespan + 1e-6, solver
        replayed, truth = executed_as_plan(result, jobs)
        validate(replayed, truth, cluster)
        if solver in ("auto", "list"):  # a plan with no idle device to fill is replayed as it is
            assert {(a.job, a.node, a.devices, round(a.start, 6)) for a in result.executed} >= {
                (a.job, a.node, a.devices, round(a.start, 6)) for a in plan.assignments if a.start == 0.0
            }


@pytest.mark.parametrize("mode", ["static", "replan", "clairvoyant"])
def test_noisy_executions_are_valid_and_use_true_runtimes(mode: str) -> None:
    jobs, cluster = random_jobs(12, 32), Cluster([8, 4])
    noise, prunes = noisy(jobs, 1)
    result = simulate(jobs, cluster, noise=noise, prune_at=prunes, mode=mode, work_limit=0.2)
    plan, truth = executed_as_plan(result, jobs)
    validate(plan, truth, cluster)
    for a in result.executed:
        assert a.end - a.start == pytest.approx(a.option.runtime * noise[a.job] * prunes.get(a.job, 1.0))
    if mode == "replan":
        assert result.replans >= 1


def test_clairvoyant_mode_matches_its_own_plan() -> None:
    jobs, cluster = random_jobs(12, 33), Cluster([8])
    noise, prunes = noisy(jobs, 2)
    result = simulate(jobs, cluster, noise=noise, prune_at=prunes, mode="clairvoyant", work_limit=0.5)
    assert result.makespan <= result.planned_makespan + 1e-6


@pytest.mark.parametrize("seed", range(3))
def test_replanning_never_makes_the_clairvoyant_case_worse(seed: int) -> None:
    # Truth == estimates: the static plan is the clairvoyant one; re-planning may only keep or improve it.
    jobs, cluster = random_jobs(12, 40 + seed), Cluster([8])
    plan = solve(jobs, cluster, "list")  # a deliberately improvable starting plan
    static = simulate(jobs, cluster, plan=plan)
    replanned = simulate(jobs, cluster, plan=plan, mode="replan", work_limit=0.3)
    assert replanned.makespan <= static.makespan + 1e-6


def test_replanning_recovers_from_prunes() -> None:
    """Many prunes free devices early. The dispatcher fills them in either mode (a trial starts on free devices
    when that delays no other), so "static" recovers part of it; re-planning also changes the options and the
    order of the trials that wait: over six seeds it wins three (one it loses, to a plan made before prunes it
    could not foresee) and is shorter in all."""
    jobs, cluster = random_jobs(16, 50), Cluster([8])
    static, replanned = [], []
    for seed in range(6):
        noise, prunes = noisy(jobs, seed, prune_rate=0.5)
        static.append(simulate(jobs, cluster, noise=noise, prune_at=prunes, solver="list").makespan)
        replanned.append(simulate(jobs, cluster, noise=noise, prune_at=prunes, mode="replan", solver="list").makespan)
    wins = sum(r < s - 1e-6 for r, s in zip(replanned, static))
    assert wins >= 3 and sum(replanned) < sum(static), (static, replanned)


def test_replanning_holds_a_slow_running_trial_for_its_observed_remaining_time() -> None:
    """Trial A runs twice as slow as estimated. At 10 s it is still running: assumed on time it would look done,
    so D (two devices) is planned to start then and F, planned after D, may not start on the free device before
    it; at A's observed step rate D is planned after A, and F fills the free device meanwhile."""
    jobs = [
        Job("A", [Option("single", 1, 10.0)]),
        Job("E", [Option("single", 1, 10.0)]),
        Job("D", [Option("ddp", 2, 10.0)]),
        Job("F", [Option("single", 1, 10.0)]),
    ]
    runs = {
        observed: simulate(
            jobs, Cluster([2]), noise={"A": 2.0}, mode="replan", solver="list", observe_step_rate=observed
        )
        for observed in (False, True)
    }
    assert runs[False].makespan == pytest.approx(40.0)  # device 1 idled from 10 s to 20 s
    assert runs[True].makespan == pytest.approx(30.0)
    assert {a.job: (a.devices, a.start) for a in runs[True].executed}["F"] == ((1,), 10.0)
