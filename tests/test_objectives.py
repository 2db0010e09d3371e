"""Planning for a deadline or a budget (issue 39, item 6): the planner's objective seam through ``solve``,
``replan`` and ``best_resize``, its check in the independent validator, and the sweep that plans for it (in the
simulator: the real loop on a virtual clock). Each plan here passes ``validate`` with its objective, or says it
misses it, with the earliest end."""

from __future__ import annotations

import random
import time

import optuna
import pytest
from optuna.trial import TrialState
from test_simulator import executed_as_plan

from optuna_saturn import SaturnExecutor
from optuna_saturn.planner import (
    MAKESPAN,
    Budget,
    Cluster,
    Deadline,
    DeadlineUnreachable,
    Job,
    Makespan,
    Option,
    Reservation,
    WorkLimit,
    best_resize,
    device_seconds,
    fewest_nodes,
    goal_of,
    plan_problems,
    replan,
    solve,
    validate,
)
from optuna_saturn.pools.protocol import PoolBroken
from optuna_saturn.simulation.known_prices import SimulatedJob
from optuna_saturn.simulation.pool import Behaviour, Fault
from optuna_saturn.simulation.simulator import run_simulation

WORK = WorkLimit(0.5)


#: Two nodes of 8 devices for two trials: the earliest end gives each trial a whole node.
CLUSTER = Cluster([8, 8])


def scaling_jobs(count: int = 2) -> list[Job]:
    """Trials that scale sublinearly: 8 devices run 3x faster than 1, for 2.7x the device-seconds."""
    options = [Option("single", 1, 900.0), Option("ddp", 2, 520.0), Option("ddp", 4, 380.0), Option("ddp", 8, 300.0)]
    return [Job(str(i), options) for i in range(count)]


def test_a_deadline_plan_meets_it_at_fewer_device_seconds_than_the_makespan_plan():
    jobs, cluster = scaling_jobs(), CLUSTER
    fastest = solve(jobs, cluster, "auto", work_limit=WORK)
    deadline = Deadline(1.3 * fastest.makespan)
    plan = solve(jobs, cluster, "auto", work_limit=WORK, goal=deadline)
    validate(plan, jobs, cluster, goal=deadline)  # the independent validator: ends by the deadline
    assert plan.info["met"] and plan.info["objective"] == "deadline"
    assert device_seconds(plan.assignments) < 0.85 * device_seconds(fastest.assignments)
    assert plan.info["device_seconds"] == pytest.approx(device_seconds(plan.assignments), abs=1e-3)


def test_a_deadline_no_plan_meets_says_so_with_the_earliest_end():
    jobs, cluster = scaling_jobs(), CLUSTER
    fastest = solve(jobs, cluster, "auto", work_limit=WORK)
    deadline = Deadline(0.5 * fastest.makespan)
    plan = solve(jobs, cluster, "auto", work_limit=WORK, goal=deadline)
    assert not plan.info["met"] and plan.info["earliest_end"] == pytest.approx(fastest.makespan)
    assert plan.makespan == pytest.approx(fastest.makespan)  # then the earliest end, not a cheap late plan
    with pytest.raises(ValueError, match="past its deadline"):
        validate(plan, jobs, cluster, goal=deadline)


def test_a_budget_plan_stays_within_it_at_the_earliest_end_it_can_and_reports_its_cost():
    jobs, cluster = scaling_jobs(), CLUSTER
    fastest = solve(jobs, cluster, "auto", work_limit=WORK)
    budget = Budget(0.8 * device_seconds(fastest.assignments), price_per_device_hour=2.5)
    plan = solve(jobs, cluster, "auto", work_limit=WORK, goal=budget)
    validate(plan, jobs, cluster, goal=budget)
    assert plan.info["met"] and plan.makespan >= fastest.makespan
    assert plan.info["cost"] == pytest.approx(device_seconds(plan.assignments) / 3600 * 2.5, abs=0.01)
    cheapest = sum(min(o.devices * o.runtime for o in j.options) for j in jobs)
    impossible = Budget(0.9 * cheapest)
    over = solve(jobs, cluster, "auto", work_limit=WORK, goal=impossible)
    assert not over.info["met"] and device_seconds(over.assignments) == pytest.approx(cheapest)
    assert plan_problems(over, jobs, cluster, goal=impossible)  # the validator sees the budget broken


def test_the_objective_is_checked_and_makespan_is_the_default():
    assert Makespan() == MAKESPAN and MAKESPAN.name == "makespan"
    with pytest.raises(ValueError, match="not both"):
        goal_of(deadline=10.0, budget=10.0)
    with pytest.raises(ValueError, match="positive"):
        Deadline(-1.0)
    assert Deadline("1h30m").seconds == 5400.0 and goal_of(budget=2.0) == Budget(7200.0)
    jobs, cluster = scaling_jobs(), CLUSTER
    plain, default = solve(jobs, cluster, "list"), solve(jobs, cluster, "list", goal=MAKESPAN)
    assert plain.assignments == default.assignments and "objective" not in default.info
    shifted = Deadline(100.0).shifted(elapsed=30.0)
    assert isinstance(shifted, Deadline) and shifted.seconds == pytest.approx(70.0)
    spent = Budget(100.0).shifted(spent=40.0)
    assert isinstance(spent, Budget) and spent.device_seconds == pytest.approx(60.0)


def test_replan_keeps_a_plan_that_meets_the_deadline_unless_a_fresh_one_is_clearly_cheaper():
    jobs, cluster = scaling_jobs(), CLUSTER
    fastest = solve(jobs, cluster, "auto", work_limit=WORK)
    deadline = Deadline(1.5 * fastest.makespan)
    kept = replan(fastest, jobs, cluster, work_limit=WORK, goal=deadline)
    assert kept.info["replan"] == "replaced" and kept.info["met"]  # the fastest plan spends more than it needs
    again = replan(kept, jobs, cluster, work_limit=WORK, goal=deadline)
    assert again.info["replan"] == "kept" and again.assignments == kept.assignments


def test_best_resize_under_a_deadline_moves_a_running_job_only_when_the_plan_gets_better_for_it():
    jobs, cluster = scaling_jobs(), CLUSTER
    busy = [Reservation(0, tuple(range(8)), 200.0, job="running")]
    moved = Job("running", [Option("single", 1, 1000.0)])  # it could run on its own, slower but cheaper
    deadline = Deadline(5000.0)
    move = best_resize(jobs, cluster, busy=busy, movable={"running": moved}, work_limit=WORK, goal=deadline)
    assert move is not None and move.job == "running"  # 1000 device-seconds alone, where it holds 1600 now
    validate(move.plan, [*jobs, moved], cluster, goal=deadline)
    tight = Deadline(600.0)  # moved, it would end at 1000 s: past this deadline
    assert best_resize(jobs, cluster, busy=busy, movable={"running": moved}, work_limit=WORK, goal=tight) is None


def _simulated(jobs: list[Job]) -> list[SimulatedJob]:
    return [SimulatedJob(j, Behaviour({o.choice: o.runtime for o in j.options})) for j in jobs]


def test_a_simulated_sweep_meets_its_deadline_with_fewer_device_seconds_and_refuses_one_it_cannot_meet():
    jobs, cluster = scaling_jobs(), CLUSTER
    fastest = run_simulation(_simulated(jobs), cluster, solver="auto", work_limit=0.5)
    end = fastest.info["wall_seconds"]
    relaxed = run_simulation(_simulated(jobs), cluster, solver="auto", work_limit=0.5, goal=Deadline(1.3 * end))
    assert relaxed.info["wall_seconds"] <= 1.3 * end
    assert device_seconds(relaxed.executed) < 0.85 * device_seconds(fastest.executed)
    with pytest.raises(DeadlineUnreachable, match="earliest end") as refused:
        run_simulation(_simulated(jobs), cluster, solver="auto", work_limit=0.5, goal=Deadline(0.5 * end))
    assert refused.value.earliest_end == pytest.approx(end, rel=0.05)


def test_fewest_nodes_leaves_out_the_nodes_a_deadline_does_not_need_but_never_a_running_jobs():
    jobs, cluster = scaling_jobs(2), Cluster([8, 8, 8])
    fastest = solve(jobs, cluster, "auto", work_limit=WORK)

    def plan_on(deadline: float, busy: list[Reservation]):
        objective = Deadline(deadline)

        def on(c: Cluster, b: list[Reservation]):
            return solve(jobs, c, "auto", work_limit=WORK, busy=b, goal=objective)

        return fewest_nodes(on(cluster, busy), cluster, busy, on), objective

    relaxed, objective = plan_on(2 * fastest.makespan, [])
    assert len({a.node for a in relaxed.assignments}) == 1 and relaxed.info["met"]
    validate(relaxed, jobs, cluster, goal=objective)
    running = [Reservation(2, (0,), 100.0, "r")]  # a job runs on node 2: it stays, and the others may go
    kept, objective = plan_on(2 * fastest.makespan, running)
    assert len({a.node for a in kept.assignments} - {2}) <= 1  # (node 0 or 1 left out: node 2 could not be)
    validate(kept, jobs, cluster, busy=running, goal=objective)
    tight, _ = plan_on(fastest.makespan, [])  # each trial needs a whole node to end by then
    assert len({a.node for a in tight.assignments}) == 2


def test_fewest_nodes_never_leaves_out_the_last_largest_node():
    """Node 0 (8 devices) has the least work, but a trial's only option needs 8 devices: it stays, and the
    4-device node goes."""
    jobs = [*scaling_jobs(1), Job("big", [Option("ddp", 8, 300.0)])]
    jobs[0] = Job("0", [Option("single", 1, 900.0), Option("ddp", 4, 380.0)])
    cluster, objective = Cluster([8, 4]), Deadline(3000.0)

    def on(c: Cluster, b: list[Reservation]):
        return solve(jobs, c, "auto", work_limit=WORK, busy=b, goal=objective)

    plan = fewest_nodes(on(cluster, []), cluster, [], on)
    assert {a.node for a in plan.assignments} == {0} and plan.info["met"]
    validate(plan, jobs, cluster, goal=objective)


def test_a_deadline_the_heuristics_alone_would_refuse_is_met_once_the_solvers_had_their_time():
    """The first plan is the heuristics' (a device waits for it); one that misses the deadline used to refuse the
    sweep with a wrong earliest end (4467 s here, where the makespan mode ends at 3764 s)."""
    rng = random.Random(5)
    jobs = []
    for i in range(6):
        size = rng.uniform(1.0, 3.0)
        options = [Option("single", 1, 900 * size), Option("ddp", 2, 520 * size), Option("ddp", 4, 380 * size)]
        jobs.append(Job(str(i), options))
    cluster = Cluster([4])
    end = run_simulation(_simulated(jobs), cluster, solver="auto", work_limit=2.0).info["wall_seconds"]
    deadline = Deadline(1.1 * end)
    assert solve(jobs, cluster, "list", time_limit=0.1, goal=deadline).info["met"] is False
    met = run_simulation(_simulated(jobs), cluster, solver="auto", work_limit=2.0, goal=deadline)
    assert met.info["wall_seconds"] <= 1.1 * end


def test_a_deadline_counts_every_trial_n_trials_will_ask_not_only_the_first_four_per_device():
    """24 trials of 100 s on 2 devices end at 1200 s at the earliest: a deadline of 600 s, which their first 8 meet,
    is refused at once (it was accepted, then missed)."""
    jobs = [Job(str(i), [Option("single", 1, 100.0)]) for i in range(24)]
    with pytest.raises(DeadlineUnreachable) as refused:
        run_simulation(_simulated(jobs), Cluster([2]), solver="auto", work_limit=0.5, goal=Deadline(600))
    assert refused.value.earliest_end == pytest.approx(1200, rel=0.05)
    met = run_simulation(_simulated(jobs), Cluster([2]), solver="auto", work_limit=0.5, goal=Deadline(1300))
    assert met.info["wall_seconds"] <= 1300


def test_under_a_deadline_a_node_no_trial_left_needs_is_given_back_and_nothing_runs_there_after():
    """Two trials on two nodes of 8: the deadline's plan puts both on node 0, so node 1 goes back to the cluster
    at once, and the devices the pool held are the ones the trials used. In makespan mode nothing goes back."""
    jobs, cluster = scaling_jobs(), CLUSTER
    fastest = run_simulation(_simulated(jobs), cluster, solver="auto", work_limit=0.5)
    assert fastest.info["released"] == {}
    assert fastest.info["held_device_seconds"] == pytest.approx(16 * fastest.info["wall_seconds"])
    end = fastest.info["wall_seconds"]
    relaxed = run_simulation(_simulated(jobs), cluster, solver="auto", work_limit=0.5, goal=Deadline(1.3 * end))
    released = relaxed.info["released"]
    assert sorted(released) == [f"node1/cuda:{i}" for i in range(8)], released
    given_back = max(released.values())
    assert not [a for a in relaxed.executed if a.node == 1 and a.end > given_back]
    validate(*executed_as_plan(relaxed, jobs), cluster)  # (raises on an overlap)
    wall = relaxed.info["wall_seconds"]
    assert relaxed.info["held_device_seconds"] == pytest.approx(8 * wall + 8 * given_back)
    assert relaxed.info["held_device_seconds"] < 0.6 * 16 * wall


def test_a_sweep_whose_kept_node_dies_after_another_was_given_back_ends_instead_of_waiting_for_ever():
    """Node 1 goes back at once (as above); node 0 dies at 100 s: no device is left, and the sweep says so."""
    simulated, deadline = _simulated(scaling_jobs()), Deadline(390.0)
    with pytest.raises(PoolBroken):
        run_simulation(
            simulated, CLUSTER, solver="auto", work_limit=0.5, goal=deadline, faults=[Fault(100.0, "lose", "node0")]
        )


# -- a real sweep on CPU devices ----------------------------------------------------------------------------------
@pytest.mark.launch
def test_a_real_sweep_refuses_a_deadline_no_plan_meets_before_any_trial_starts(saturn_options):
    import objectives

    study = optuna.create_study()
    for seconds in (3.0, 3.0, 3.0):
        study.enqueue_trial({"seconds": seconds})
    executor = SaturnExecutor(devices=2, strategies=["single"], deadline="1s", **saturn_options)
    began = time.monotonic()
    with pytest.raises(DeadlineUnreachable, match="earliest end") as refused:
        executor.optimize(study, objectives.sleeps, n_trials=3)
    assert refused.value.earliest_end > 1.0
    assert f"the earliest end is {refused.value.earliest_end:.0f} s" in str(refused.value)  # one figure, said once
    assert not [t for t in study.trials if t.state == TrialState.COMPLETE]  # refused at once: nothing ran
    assert time.monotonic() - began < 60


@pytest.mark.launch
def test_a_refused_deadline_leaves_a_sampling_study_as_it_was_and_a_met_one_samples_as_plain_optuna(saturn_options):
    """No trial is asked before the deadline is checked: a trial of a copy of the study (its sampler copied) is
    priced instead, so the refused sweep leaves no trial (it left a FAIL one), and the study's sampler is untouched:
    the next sweep's trials have the parameters a fresh sampler of the same seed gives."""
    import objectives

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    began = time.monotonic()
    with pytest.raises(DeadlineUnreachable, match="earliest end"):
        SaturnExecutor(devices=2, strategies=["single"], deadline="1s", **saturn_options).optimize(
            study, objectives.sleeps, n_trials=3
        )
    assert study.trials == []
    assert time.monotonic() - began < 30
    SaturnExecutor(devices=2, strategies=["single"], deadline="10m", **saturn_options).optimize(
        study, objectives.train_linear, n_trials=2
    )
    assert [(t.number, t.state) for t in study.trials] == [(0, TrialState.COMPLETE), (1, TrialState.COMPLETE)]
    plain = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    first_two = [plain.ask().suggest_float("lr", 0.05, 0.2) for _ in range(2)]  # (the two trials run at once)
    assert sorted(t.params["lr"] for t in study.trials) == sorted(first_two)


@pytest.mark.launch
def test_a_real_sweep_with_a_deadline_it_can_meet_runs_every_trial_and_records_its_objective(saturn_options):
    import objectives

    study = optuna.create_study()
    for seconds in (0.5, 0.5):
        study.enqueue_trial({"seconds": seconds})
    executor = SaturnExecutor(
        devices=2, strategies=["single"], deadline="10m", price_per_device_hour=3.0, **saturn_options
    )
    executor.optimize(study, objectives.sleeps, n_trials=2)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    summary = study.user_attrs["saturn:last_sweep"]
    assert summary["objective"]["kind"] == "deadline" and summary["wall_seconds"] <= 600
    assert summary["device_seconds"] > 0 and summary["cost"] == pytest.approx(
        summary["device_seconds"] / 1200, abs=0.01
    )


def test_without_a_deadline_or_a_budget_the_sweep_plans_for_the_makespan_exactly_as_before(tmp_path):
    executor = SaturnExecutor(
        devices=1, strategies=["single"], log_dir=tmp_path, progress=None, dashboard=False, price_per_device_hour=2.0
    )
    objective = executor._settings.goal
    assert objective == Makespan(price_per_device_hour=2.0)
    jobs = scaling_jobs()
    with_price = solve(jobs, CLUSTER, "list", goal=objective)  # (a price only adds costs to the reports)
    assert with_price.assignments == solve(jobs, CLUSTER, "list").assignments and "objective" not in with_price.info


def test_a_static_plan_is_never_replaced_under_a_deadline_either():
    jobs, cluster = scaling_jobs(), CLUSTER
    fastest = solve(jobs, cluster, "auto", work_limit=WORK)
    deadline = Deadline(1.5 * fastest.makespan)
    kept = replan(fastest, jobs, cluster, work_limit=WORK, goal=deadline, min_improvement=float("inf"))
    assert kept.info["replan"] == "kept" and kept.assignments == fastest.assignments
