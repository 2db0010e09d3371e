"""Scheduling rules of the real sweep loop, on the simulated pool: no process starts, time is virtual, and each
test takes a fraction of a second. Every trial is a job of :func:`optuna_saturn.simulation.simulator.run_simulation`,
enqueued with its index as the parameter ``job``; its true runtime, prune and faults are the simulated world's."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from optuna_saturn.devices import Device
from optuna_saturn.events import ProfileEvent, SweepListener
from optuna_saturn.planner import Assignment, Cluster, Job, Option, Plan
from optuna_saturn.simulation.known_prices import JOB_PARAMETER, SimulatedJob
from optuna_saturn.simulation.pool import Behaviour, Fault
from optuna_saturn.simulation.simulator import run_simulation


def job(
    name: str,
    *options: tuple[str, int, float],
    prune_at: float = 1.0,
    describe: float = 0.0,
    measured: bool = True,
    uncertainty: float = 0.0,
    checkpoint_every: int | None = None,
) -> SimulatedJob:
    opts = [Option(strategy, devices, runtime) for strategy, devices, runtime in options]
    return SimulatedJob(
        Job(name, opts),
        Behaviour({o.choice: o.runtime for o in opts}, prune_at=prune_at, checkpoint_every=checkpoint_every),
        measured=measured,
        uncertainty=uncertainty,
        describe_seconds=describe,
    )


def single(name: str, runtime: float, **kwargs) -> SimulatedJob:
    return job(name, ("single", 1, runtime), **kwargs)


def study_of(jobs: list[SimulatedJob]) -> optuna.Study:
    study = optuna.create_study()
    for index in range(len(jobs)):
        study.enqueue_trial({JOB_PARAMETER: index})
    return study


def runs(result) -> dict[str, list[Assignment]]:
    out: dict[str, list[Assignment]] = {}
    for a in result.executed:
        out.setdefault(a.job, []).append(a)
    return out


class Profiles(SweepListener):
    def __init__(self) -> None:
        self.started: list[ProfileEvent] = []

    def on_profile(self, study, event) -> None:
        if event.phase == "started":
            self.started.append(event)


# -- asking: the first round past a timeout, study.stop() -------------------------------------------------------------
@pytest.mark.parametrize("known_ahead", [True, False])
def test_past_a_timeout_every_device_still_gets_its_first_trial_and_no_more(known_ahead):
    """Plain Optuna's n_jobs threads each start a trial within moments; describing a trial here takes 1 s, longer
    than the timeout: still one trial per device runs, and the rest stay in the study's queue."""
    jobs = [single(f"t{i}", 10.0, describe=1.0) for i in range(5)]
    study = study_of(jobs)
    result = run_simulation(jobs, Cluster([2]), timeout=0.5, study=study, known_ahead=known_ahead, solver="list")
    assert len(result.executed) == 2
    states = [t.state for t in study.trials]
    assert states.count(TrialState.COMPLETE) == 2 and states.count(TrialState.WAITING) == 3


def test_study_stop_from_a_callback_stops_asking_and_the_asked_trials_finish():
    jobs = [single(f"t{i}", 10.0 + i) for i in range(8)]
    study = study_of(jobs)

    def stop_after_the_first(study, trial):
        study.stop()

    result = run_simulation(
        jobs, Cluster([2]), study=study, known_ahead=False, callbacks=[stop_after_the_first], solver="list"
    )
    states = [t.state for t in study.trials]
    assert states.count(TrialState.RUNNING) == 0
    asked = [t for t in study.trials if t.state != TrialState.WAITING]
    assert all(t.state == TrialState.COMPLETE for t in asked)
    first_end = min(a.end for a in result.executed)
    assert all(a.start < first_end for a in result.executed)  # nothing was started after the stop
    assert len(asked) < len(jobs)


# -- dispatch: backfilling and early starts --------------------------------------------------------------------------
def test_a_short_trial_planned_after_a_blocked_one_backfills_the_free_device():
    a, b, c = single("A", 10.0), job("B", ("ddp", 2, 10.0)), single("C", 4.0)
    plan = Plan(
        (
            Assignment("A", a.job.options[0], 0, (0,), 0.0, 10.0),
            Assignment("B", b.job.options[0], 0, (0, 1), 10.0, 20.0),
            Assignment("C", c.job.options[0], 0, (1,), 20.0, 24.0),
        )
    )
    result = run_simulation([a, b, c], Cluster([2]), mode="static", plan=plan, solver="list")
    (ran,) = runs(result)["C"]
    assert (ran.devices, ran.start, ran.end) == ((1,), 0.0, 4.0)  # it ends before B may start: it goes first
    assert result.makespan == pytest.approx(20.0)


def test_a_trial_planned_for_later_starts_at_once_under_another_option_that_ends_it_no_later():
    a, e = single("A", 10.0), single("E", 10.0)
    d = job("D", ("single", 1, 10.0), ("ddp", 2, 6.0))
    plan = Plan(
        (
            Assignment("A", a.job.options[0], 0, (0,), 0.0, 10.0),
            Assignment("E", e.job.options[0], 0, (1,), 0.0, 10.0),
            Assignment("D", d.job.options[1], 0, (0, 1), 10.0, 16.0),
        )
    )
    result = run_simulation([a, e, d], Cluster([3]), mode="static", plan=plan, solver="list")
    (ran,) = runs(result)["D"]
    assert (ran.option.choice, ran.devices, ran.start) == (("single", 1, 1), (2,), 0.0)
    assert result.makespan == pytest.approx(10.0)


# -- profiling: the value of information ----------------------------------------------------------------------------
@pytest.mark.parametrize("single_runtime, measured", [(200.0, True), (500.0, False)])
def test_an_uncertain_option_is_measured_on_the_idle_device_only_if_it_could_shorten_the_plan(single_runtime, measured):
    """B waits for A's device to run on both (its 2-device option is priced at 40 s), so device 1 idles. B's
    one-device option, predicted with a 60% uncertainty, could start there at once: at 200 s, optimistically
    125 s, it would end B before 152 s, so it is worth 7 s of profiling; at 500 s (312 s at best) it would not."""
    a = single("A", 100.0)
    b = job("B", ("single", 1, single_runtime), ("ddp", 2, 40.0), measured=False, uncertainty=0.6)
    heard = Profiles()
    result = run_simulation([a, b], Cluster([2]), listeners=[heard], solver="list")
    assert [(e.trial, e.option) for e in heard.started] == ([(1, "single ×1")] if measured else [])
    (ran,) = runs(result)["B"]
    assert ran.option.choice == ("ddp", 2, 1)  # measured, it is as slow as predicted: B still waits for A


class Plans(SweepListener):
    def __init__(self) -> None:
        self.seen: list[tuple[float, Plan]] = []

    def on_plan(self, study, plan, trial_numbers, now) -> None:
        self.seen.append((now, plan))


def test_a_trial_waiting_behind_an_unmeasured_one_is_priced_from_its_first_steps_while_it_runs():
    """A cold sweep measures an option by its first real run. A runs 100 s where the prior says 10; B, of the same
    workload, waits for the one device. Once A has taken 10 of its 100 steps, its step rate is the option's profile:
    B is planned at its true 100 s while A still runs, not once A ends (on a GPU, hours of a wrong ETA)."""
    prior, truth = Option("single", 1, 10.0), {("single", 1, 1): 100.0}
    a, b = (
        SimulatedJob(Job(name, [prior]), Behaviour(truth), measured=False, uncertainty=0.6, workload="w")
        for name in ("A", "B")
    )
    plans = Plans()
    result = run_simulation([a, b], Cluster([1]), listeners=[plans], solver="list")
    b_planned = [(now, x.option.runtime) for now, plan in plans.seen for x in plan.assignments if x.job == "1"]
    assert b_planned[0][1] < 20.0  # the prior's 10 s, weighed by caution
    repriced = [now for now, runtime in b_planned if runtime == pytest.approx(100.0, rel=0.05)]
    assert repriced and 10.0 <= repriced[0] < 20.0, b_planned  # after A's 10th step (10 s), long before its end
    assert result.makespan == pytest.approx(200.0, rel=0.01)


# -- faults: a stall, a rank's death, nodes lost and joined -----------------------------------------------------------
def test_a_trial_whose_rank_hangs_is_stopped_at_its_stall_limit_and_run_again():
    jobs = [single("t0", 100.0), single("t1", 100.0)]
    study = study_of(jobs)
    result = run_simulation(
        jobs, Cluster([2]), study=study, stall_timeout=30.0, faults=[Fault(20.0, "hang", 0)], solver="list"
    )
    hung = next(t for t in study.trials if t.state == TrialState.FAIL)
    assert "reported no progress for" in hung.system_attrs["saturn:fail_reason"]
    assert hung.system_attrs["saturn:actual_end"] == pytest.approx(50.0, abs=0.5)  # 20 s of steps + the 30 s limit
    retry = next(t for t in study.trials if t.user_attrs.get("saturn:retry_of") == hung.number)
    assert retry.state == TrialState.COMPLETE and retry.params == hung.params
    assert result.makespan == pytest.approx(150.0, abs=0.5)


def test_a_trial_whose_rank_dies_ends_on_the_death_and_runs_again_counted_beside_n_trials():
    jobs = [single(f"t{i}", 30.0) for i in range(3)]
    study = study_of(jobs)
    run_simulation(jobs, Cluster([2]), study=study, n_trials=3, faults=[Fault(5.0, "kill", 0)], solver="list")
    trials = study.trials
    dead = next(t for t in trials if t.state == TrialState.FAIL)
    assert "the worker of device 0 died" in dead.system_attrs["saturn:fail_reason"]
    assert dead.system_attrs["saturn:actual_end"] == pytest.approx(5.0)  # at the death, not at a stall limit
    assert [t.state for t in trials].count(TrialState.COMPLETE) == 3  # n_trials new trials, and the retry
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]


def test_a_trial_whose_rank_dies_after_a_checkpoint_runs_again_from_it():
    jobs = [single("t0", 100.0, checkpoint_every=20), single("t1", 100.0)]
    study = study_of(jobs)
    result = run_simulation(jobs, Cluster([2]), study=study, faults=[Fault(50.0, "kill", 0)], solver="list")
    dead = next(t for t in study.trials if t.state == TrialState.FAIL)
    retry = next(t for t in study.trials if t.user_attrs.get("saturn:retry_of") == dead.number)
    assert retry.state == TrialState.COMPLETE and retry.system_attrs["saturn:resumed_from_step"] == 40
    assert result.makespan == pytest.approx(50.0 + 60.0, abs=0.5)  # the 60 steps after its checkpoint at 40


def test_a_lost_node_fails_its_trials_which_run_again_on_the_node_left_and_a_joined_node_takes_later_trials():
    jobs = [single(f"t{i}", 20.0) for i in range(8)]
    study = study_of(jobs)
    joined = [Device("cuda", i, node="node2") for i in range(2)]
    result = run_simulation(
        jobs,
        Cluster([2, 2]),
        study=study,
        faults=[Fault(5.0, "lose", "node1"), Fault(30.0, "join", joined)],
        solver="list",
    )
    lost = [t for t in study.trials if t.state == TrialState.FAIL]
    assert len(lost) == 2 and all("node node1 died" in t.system_attrs["saturn:fail_reason"] for t in lost)
    assert all(
        any(r.user_attrs.get("saturn:retry_of") == t.number and r.state == TrialState.COMPLETE for r in study.trials)
        for t in lost
    )
    assert not any(a.node == 1 and a.start >= 5.0 for a in result.executed)  # nothing runs on the lost node
    assert any(a.node == 2 and a.start >= 30.0 for a in result.executed)  # the joined one runs later trials


# -- pruning frees devices; elastic moves ----------------------------------------------------------------------------
def test_the_devices_of_a_pruned_trial_go_to_the_next_trial_at_once():
    jobs = [single("A", 100.0, prune_at=0.1), single("B", 100.0), single("C", 50.0)]
    result = run_simulation(jobs, Cluster([2]), solver="list")
    (a,), (c,) = runs(result)["A"], runs(result)["C"]
    assert a.end == pytest.approx(10.0) and c.start == pytest.approx(10.0) and c.devices == a.devices


def test_a_trial_left_alone_moves_to_the_devices_its_pruned_neighbours_freed_at_its_next_checkpoint():
    jobs = [job("long", ("single", 1, 100.0), ("ddp", 4, 30.0), checkpoint_every=10)] + [
        single(f"p{i}", 100.0, prune_at=0.1) for i in range(3)
    ]
    result = run_simulation(jobs, Cluster([4]), elastic=True, solver="list")
    first, then = sorted(runs(result)["long"], key=lambda a: a.start)
    assert (first.option.devices, first.end) == (1, pytest.approx(20.0))  # asked at 10 s, stops at step 20
    assert then.option.devices == 4 and then.end == pytest.approx(20.0 + 0.8 * 30.0)


def test_listeners_hear_when_the_workers_are_ready_and_the_plain_view_says_so_at_once():
    """Starting the workers takes seconds on a real machine (the objective's imports, CUDA): the plain view says
    at its first line that they are starting, and when all are ready (a trial starts on the first ready one)."""
    import io

    from optuna_saturn.progress import PlainProgress

    class Ready(SweepListener):
        def __init__(self) -> None:
            self.at: list[float] = []

        def on_workers_ready(self, study, now) -> None:
            self.at.append(now)

    out = io.StringIO()
    heard = Ready()
    run_simulation(
        [single("a", 5.0), single("b", 5.0)],
        Cluster([2]),
        workers_ready=[2.0, 3.0],
        listeners=[heard, PlainProgress(stream=out)],
    )
    assert heard.at == [3.0]
    lines = out.getvalue().splitlines()
    assert "starting a worker on each" in lines[0]
    assert any("workers ready on 2 device(s) after 3.0 s" in line for line in lines)


def test_the_sweeps_summary_on_the_study_stays_short_however_many_trials():
    """``saturn:last_sweep`` is what optuna-dashboard shows in the study's attributes: a few numbers, not one per
    trial (its ask times were a list of every trial's)."""
    import json

    jobs = [single(f"j{i}", 1.0 + i % 7) for i in range(300)]
    study = study_of(jobs)
    run_simulation(jobs, Cluster([8]), study=study)
    summary = study.user_attrs["saturn:last_sweep"]
    assert summary["trials"] == 300 and summary["ask_seconds"]["count"] == 300
    assert len(json.dumps(summary)) < 800, summary
