"""Elastic resize: the planner's rule for moving a running trial, the simulator that measures it, and a real sweep
on CPU devices that moves a trial from one device to two when its neighbour is pruned."""

from __future__ import annotations

import itertools
import random
from collections import defaultdict

import objectives
import optuna
import pytest
from optuna.trial import TrialState

from optuna_saturn import SaturnExecutor
from optuna_saturn.planner import Cluster, Job, Option, Plan, Reservation, best_resize, remaining_job, validate
from optuna_saturn.simulation.simulator import simulate

try:
    from test_planner import random_jobs
except ImportError:  # tests/ imported as a package
    from tests.test_planner import random_jobs


def scalable(name: str, runtime: float, on_two: float = 0.5, on_four: float = 0.25) -> Job:
    """A job that takes ``on_two`` of its runtime on 2 devices and ``on_four`` on 4 (perfect scaling by default)."""
    return Job(
        name, [Option("single", 1, runtime), Option("ddp", 2, runtime * on_two), Option("ddp", 4, runtime * on_four)]
    )


def test_remaining_job_scales_the_other_options_and_adds_the_restart() -> None:
    job = scalable("a", 100.0)
    rest = remaining_job("a", job.options, current=("single", 1, 1), left=0.5, rate=1.2, restart=7.0)
    assert [o.choice for o in rest.options] == [("ddp", 2, 1), ("ddp", 4, 1)]
    assert [o.runtime for o in rest.options] == pytest.approx([50 * 0.5 * 1.2 + 7, 25 * 0.5 * 1.2 + 7])
    assert remaining_job("a", [Option("single", 1, 10.0)], current=("single", 1, 1), left=0.5) is None


def test_a_lone_long_trial_takes_the_devices_that_freed_and_a_costly_move_is_not_made() -> None:
    cluster = Cluster([4])
    # "long" runs on device 0 with 90 s left on one device; devices 1-3 are free and nothing else waits.
    busy = [Reservation(0, (0,), 90.0, job="long")]
    rest = remaining_job("long", scalable("long", 100.0).options, current=("single", 1, 1), left=0.9, restart=5.0)
    move = best_resize([], cluster, busy=busy, movable={"long": rest}, min_gain={"long": 5.0})
    assert move is not None and move.job == "long"
    assert move.plan.for_job("long").option.devices == 4
    assert move.makespan == pytest.approx(90 / 4 + 5) and move.kept_makespan == pytest.approx(90)
    # the same move when it costs more than it gains (twice: the cost is also the margin it must beat)
    costly = remaining_job("long", scalable("long", 100.0).options, current=("single", 1, 1), left=0.9, restart=40.0)
    assert best_resize([], cluster, busy=busy, movable={"long": costly}, min_gain={"long": 40.0}) is None
    # and no move while the devices are taken by trials that wait
    waiting = [Job(f"w{i}", [Option("single", 1, 90.0)]) for i in range(3)]
    assert best_resize(waiting, cluster, busy=busy, movable={"long": rest}, min_gain={"long": 5.0}) is None


def _check_segments(result, jobs, noise, prunes, restart) -> None:
    """No device runs two segments at once, and each job's segments add up to its true work plus one restart per
    move (a moved job goes on where it was: nothing is lost, nothing done twice)."""
    by_device = defaultdict(list)
    for a in result.executed:
        for d in a.devices:
            by_device[(a.node, d)].append((a.start, a.end))
    for spans in by_device.values():
        spans.sort()
        assert all(e <= s + 1e-6 for (_, e), (s, _) in itertools.pairwise(spans))
    options = {j.name: {o.choice: o for o in j.options} for j in jobs}
    for job in jobs:
        segments = sorted((a for a in result.executed if a.job == job.name), key=lambda a: a.start)
        done = 0.0
        for i, a in enumerate(segments):
            full = options[job.name][a.option.choice].runtime * noise[job.name]
            done += (a.end - a.start - (restart if i else 0.0)) / full
        assert done == pytest.approx(prunes.get(job.name, 1.0), abs=1e-6), job.name


def test_the_simulator_moves_a_trial_whose_neighbours_were_pruned() -> None:
    jobs = [scalable(name, 100.0, 0.6, 0.35) for name in ("long", "a", "b", "c")]  # each best on one device
    cluster = Cluster([4])
    noise, prunes = {j.name: 1.0 for j in jobs}, {"a": 0.1, "b": 0.1, "c": 0.1}  # three of four end at 10 s
    plain = simulate(jobs, cluster, noise=noise, prune_at=prunes, mode="replan", solver="list")
    moved = simulate(jobs, cluster, noise=noise, prune_at=prunes, mode="replan", solver="list", resize_seconds=5.0)
    assert plain.makespan == pytest.approx(100.0)  # four on one device each; "long" alone after 10 s
    assert moved.info["resizes"] == 1
    # the loop asks the move at 10 s; "long" stops at its next checkpoint (every 10 steps: 20 s), and goes on
    # from there on 4 devices after its 5 s restart
    assert moved.makespan == pytest.approx(20 + 5 + 0.8 * 35)
    _check_segments(moved, jobs, noise, prunes, 5.0)


@pytest.mark.parametrize("seed", range(4))
def test_moves_in_noisy_executions_are_valid(seed: int) -> None:
    jobs, cluster = random_jobs(14, 40 + seed), Cluster([8])
    rng = random.Random(seed)
    noise = {j.name: rng.uniform(0.8, 1.2) for j in jobs}
    prunes = {j.name: rng.uniform(0.1, 0.6) for j in jobs if rng.random() < 0.3}
    result = simulate(jobs, cluster, noise=noise, prune_at=prunes, mode="replan", solver="list", resize_seconds=30.0)
    _check_segments(result, jobs, noise, prunes, 30.0)
    plain = simulate(jobs, cluster, noise=noise, prune_at=prunes, mode="replan", solver="list")
    if result.info["resizes"] == 0:
        assert result.makespan == pytest.approx(plain.makespan)


def test_resize_needs_replanning() -> None:
    with pytest.raises(ValueError, match="resize_seconds needs mode='replan'"):
        simulate([scalable("a", 1.0)], Cluster([2]), mode="static", resize_seconds=1.0)


def test_plans_without_moves_still_validate() -> None:
    jobs, cluster = [scalable("long", 100.0)], Cluster([4])
    result = simulate(jobs, cluster, mode="replan", solver="list", resize_seconds=5.0)
    assert result.info["resizes"] == 0  # it took all 4 devices from the start
    validate(Plan(result.executed), jobs, cluster)


EPOCHS = 20  # 80 steps
STEP_SLEEP = "0.1"  # seconds per step on one device, half on two


@pytest.mark.launch
@pytest.mark.parametrize("every", [8, 5], ids=["at-epoch-ends", "mid-epoch"])
def test_a_running_trial_moves_to_the_devices_its_pruned_neighbour_left(saturn_options, tmp_path, monkeypatch, every):
    """Moved from one device to two at its next checkpoint, the trial ends as it would have unmoved: with
    checkpoints every 5 steps of 4-step epochs it moves in the middle of an epoch, and its shuffled loader goes
    on with the batches of that epoch it had not trained on yet."""
    monkeypatch.setenv("SATURN_TEST_CHECKPOINT_EVERY", str(every))
    monkeypatch.setenv("SATURN_TEST_EPOCHS", str(EPOCHS))
    monkeypatch.setenv("SATURN_TEST_STEP_SLEEP", STEP_SLEEP)
    monkeypatch.setenv("SATURN_TEST_SLEEP_SPLIT", "1")
    reference = optuna.create_study()
    reference.enqueue_trial({"lr": 0.02})
    SaturnExecutor(
        devices=1, strategies=["single"], elastic=False, **{**saturn_options, "log_dir": tmp_path / "reference"}
    ).optimize(reference, objectives.resumable, n_trials=1)

    monkeypatch.setenv("SATURN_TEST_PRUNE_AT", "1:8")  # trial 1 stops at step 8 of 80; trial 0 is left alone
    study = optuna.create_study()
    study.enqueue_trial({"lr": 0.02})
    study.enqueue_trial({"lr": 0.025})
    SaturnExecutor(devices=2, strategies=["single", "ddp"], **saturn_options).optimize(
        study, objectives.resumable, n_trials=2
    )

    moved, pruned = study.trials
    assert pruned.state == TrialState.PRUNED
    assert moved.state == TrialState.COMPLETE, moved.system_attrs.get("saturn:fail_reason")
    (move,) = moved.system_attrs["saturn:moves"]
    assert move["from"] == "single ×1" and len(move["device_ids"]) == 1, move
    assert move["started"] < move["at"] <= moved.system_attrs["saturn:actual_start"], move
    assert moved.system_attrs["saturn:strategy"] == "ddp" and moved.system_attrs["saturn:num_devices"] == 2
    assert moved.system_attrs["saturn:resumed_from_step"] == move["at_step"] == moved.user_attrs["started_at_step"]
    assert every <= move["at_step"] < EPOCHS * 4 and move["at_step"] % every == 0
    if every == 5:
        assert move["at_step"] % 4, f"moved at an epoch's end ({move['at_step']}): the test meant mid-epoch"
    # every epoch reported once, and the run ends as the unmoved one did
    assert sorted(moved.intermediate_values) == list(range(4, EPOCHS * 4 + 1, 4))
    for step, value in reference.trials[0].intermediate_values.items():
        assert moved.intermediate_values[step] == pytest.approx(value, rel=1e-4), step
    assert moved.value == pytest.approx(reference.trials[0].value, rel=1e-4)


@pytest.mark.launch
def test_with_elastic_off_a_trial_stays_where_it_started(saturn_options, monkeypatch):
    monkeypatch.setenv("SATURN_TEST_EPOCHS", str(EPOCHS))
    monkeypatch.setenv("SATURN_TEST_STEP_SLEEP", STEP_SLEEP)
    monkeypatch.setenv("SATURN_TEST_SLEEP_SPLIT", "1")
    monkeypatch.setenv("SATURN_TEST_PRUNE_AT", "1:8")
    study = optuna.create_study()
    study.enqueue_trial({"lr": 0.02})
    study.enqueue_trial({"lr": 0.025})
    SaturnExecutor(devices=2, strategies=["single", "ddp"], elastic=False, **saturn_options).optimize(
        study, objectives.resumable, n_trials=2
    )
    kept = study.trials[0]
    assert kept.state == TrialState.COMPLETE and "saturn:moves" not in kept.system_attrs
    assert kept.user_attrs["started_at_step"] == 0
