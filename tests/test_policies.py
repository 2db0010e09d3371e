"""Each policy of the sweep alone, on a state built by hand: no pool, no simulation, no process. A policy reads the
state (and the options view) and returns decisions; these tests check the decisions, and that a policy changes
nothing but its own memory. Each runs in a few milliseconds."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from optuna_saturn.clock import VirtualClock
from optuna_saturn.devices import Device
from optuna_saturn.planner import Assignment, Option, validate
from optuna_saturn.pools.protocol import JobEnd
from optuna_saturn.pricing.prices import PricedOption, ProfileEntry, ProfileJob, TrialPrice
from optuna_saturn.pricing.unprofiled import RuntimeEstimator
from optuna_saturn.profiler import ProfileRecord, Workload
from optuna_saturn.strategy import select_strategies
from optuna_saturn.study.trial_session import TrialSession
from optuna_saturn.sweep import dispatch
from optuna_saturn.sweep.asking import Asking, Next
from optuna_saturn.sweep.decisions import Admit, Describe, Fail, LeaveOut, Readmit, Release, Start, Stop
from optuna_saturn.sweep.elastic import Elastic
from optuna_saturn.sweep.faults import Faults
from optuna_saturn.sweep.options import OptionsView
from optuna_saturn.sweep.outcomes import EARLY_LESSON_STEPS, Outcomes
from optuna_saturn.sweep.planning import Planning
from optuna_saturn.sweep.profiling import Profiling
from optuna_saturn.sweep.releasing import Releasing
from optuna_saturn.sweep.settings import SweepSettings
from optuna_saturn.sweep.state import SweepState, TrialRun, Waiting
from optuna_saturn.worker.failures import CRASH, OUT_OF_MEMORY, PEER_GONE, RankFailure

STRATEGIES = select_strategies(["single", "ddp"], 2, device_kind="cpu")
WORKLOAD = Workload("model", 1000, 4, "batch", total_steps=100)


@pytest.fixture(autouse=True)
def _fast(request):
    """Every test here is a unit test: it must take well under half a second."""
    began = time.perf_counter()
    yield
    assert time.perf_counter() - began < 0.5, f"{request.node.name} took too long for a policy's unit test"


def state_of(devices: int = 2) -> SweepState:
    return SweepState(0.0, [Device("cpu", i, cores=(i,)) for i in range(devices)])


def settings_of(state: SweepState, tmp_path: Path = Path("/nonexistent"), **options) -> SweepSettings:
    return SweepSettings(state.devices, STRATEGIES, "list", 1.0, tmp_path, **options)


def view_of(state: SweepState) -> OptionsView:
    return OptionsView(RuntimeEstimator(STRATEGIES, state.largest_node), profile_steps=(2, 5))


_study = optuna.create_study()


def priced(*options: tuple[str, int, float], measured: bool = True) -> TrialPrice:
    """A described trial's price: each option measured (a profile of 0.1 s a step) or predicted, 30% unsure."""

    def one(strategy: str, devices: int, runtime: float) -> PricedOption:
        key = f"{strategy}-{devices}"
        if not measured:
            return PricedOption(Option(strategy, devices, runtime), key, uncertainty=0.3, basis="predicted")
        record = ProfileRecord(key, strategy, devices, "cpu", True, step_seconds=0.1)
        return PricedOption(Option(strategy, devices, runtime), key, record=record)

    return TrialPrice(WORKLOAD, [one(*option) for option in options])


def waiting(price: TrialPrice, state: SweepState | None = None) -> Waiting:
    w = Waiting(_study.ask(), price, price_history=[[-1, []]])
    if state is not None:
        state.admit(w)
    return w


def running(state: SweepState, option: Option, devices: tuple[int, ...], *, started: float = 0.0) -> TrialRun:
    w = waiting(priced((option.strategy, option.devices, option.runtime)))
    w.assignment = Assignment(str(w.number), option, 0, devices, 0.0, option.runtime)
    session = TrialSession(w.trial, threading.Lock(), VirtualClock())
    run = TrialRun(f"trial-{w.number}", devices, started, Path("log"), waiting=w, session=session)
    state.launched(run)
    return run


# -- asking -------------------------------------------------------------------------------------------------------
def test_asking_asks_for_an_idle_device_plans_first_after_a_change_and_stops_at_the_lookahead():
    state = state_of(2)
    asking = Asking(timeout=None, lookahead=2, profile_only=False, describe_ahead=False, ask_ahead=False)
    view = view_of(state)
    assert asking.next(state, 0.0, view) is Next.ASK  # two devices with nothing to do
    waiting(priced(("single", 1, 10.0)), state)  # admitted, not planned: the state says the plan is stale
    assert asking.next(state, 0.0, view) is Next.PLAN_FIRST
    waiting(priced(("single", 1, 10.0)), state)
    assert asking.next(state, 0.0, view) is None  # two wait: the look-ahead is full
    state.n_trials, state.asked = 2, 2
    assert not asking.may_ask(state, 0.0, stop_requested=False)


def test_asking_admits_a_priced_trial_and_fails_one_no_option_fits():
    fits, fits_not = waiting(priced(("single", 1, 10.0))), waiting(TrialPrice(WORKLOAD))
    assert Asking.admission(fits) == Admit(fits)
    failed = Asking.admission(fits_not)
    assert isinstance(failed, Fail) and failed.waiting is fits_not and "no strategy fits" in failed.reason


# -- options ------------------------------------------------------------------------------------------------------
def test_the_options_view_learns_a_runtime_from_a_complete_first_run_only():
    state = state_of(1)
    view = view_of(state)
    option = Option("single", 1, 50.0)
    run = running(state, option, (0,))
    before = view.estimator.estimate("single", 1)
    view.ended(run, TrialState.FAIL, 123.0)
    assert view.estimator.estimate("single", 1) == before  # a failure teaches no runtime
    run.session.resumed_from = 10
    view.ended(run, TrialState.COMPLETE, 123.0)
    assert view.estimator.estimate("single", 1) == before  # nor does a run that resumed (part of a trial)
    run.session.resumed_from = 0
    view.ended(run, TrialState.COMPLETE, 123.0)
    assert view.estimator.estimate("single", 1) == pytest.approx(123.0)


# -- planning -----------------------------------------------------------------------------------------------------
def test_planning_places_every_waiting_trial_in_a_valid_plan_and_unplans_lost_devices(tmp_path):
    state = state_of(2)
    view = view_of(state)
    trials = [waiting(priced(("single", 1, 10.0 * (i + 1)), ("ddp", 2, 6.0 * (i + 1))), state) for i in range(3)]
    planning = Planning(settings_of(state, tmp_path))
    assert planning.due(state, {0, 1})
    planned = planning.plan(state, view, 0.0)
    assert planned is not None and set(planned.places) == {w.number for w in trials}
    jobs = [view.planned_job(w, state) for w in trials]
    validate(planned.shown, [j for j in jobs], state.cluster)  # the independent validator
    for w in trials:
        w.assignment = planned.places[w.number]
    state.nodes_changed(state.devices, {1}, 0.0)
    unplan = planning.unplan_lost(state)
    assert set(unplan.numbers) == {w.number for w in trials if 1 in w.assignment.devices}


# -- dispatch -----------------------------------------------------------------------------------------------------
def test_dispatch_starts_a_planned_trial_on_its_devices_once_their_workers_are_ready():
    state = state_of(2)
    view = view_of(state)
    w = waiting(priced(("ddp", 2, 10.0)), state)
    w.assignment = Assignment(str(w.number), Option("ddp", 2, 10.0), 0, (0, 1), 0.0, 10.0)
    state.planned([w.number])
    assert dispatch.starts(state, {0}, view, 0.0) == []  # one worker is still starting
    assert dispatch.starts(state, {0, 1}, view, 0.0) == [Start(w, Option("ddp", 2, 10.0), (0, 1))]


# -- profiling ----------------------------------------------------------------------------------------------------
class OneJobPerOption:
    """A price source that groups each wanted option into a job of its own (what a profiling policy asks)."""

    def profile_jobs(self, wanted):
        return [
            ProfileJob((ProfileEntry(trial, WORKLOAD, tuple(s for s in STRATEGIES if s.name == name), (name,)),), n)
            for trial, (name, n, _) in wanted
        ]


def test_a_profile_only_sweep_measures_every_option_on_idle_devices_within_its_budget():
    state = state_of(2)
    view = view_of(state)
    w = waiting(priced(("single", 1, 10.0), ("ddp", 2, 6.0), measured=False), state)
    profiling = Profiling(OneJobPerOption(), budget=None, profile_only=True)
    profiling.measure_every_option(w.trial, w.price)
    measures = profiling.measurements(state, {0, 1}, view, 0, 0.0)
    assert [(m.job.devices, len(m.devices)) for m in measures] == [(1, 1)]  # ddp x2 waits for both devices
    assert profiling.pending
    spent = Profiling(OneJobPerOption(), budget=0.0, profile_only=True)
    spent.measure_every_option(w.trial, w.price)
    assert spent.measurements(state, {0, 1}, view, 0, 0.0) == []  # the budget is spent


def test_without_prices_nothing_is_measured():
    state = state_of(1)
    assert Profiling(None, budget=None, profile_only=False).measurements(state, {0}, view_of(state), 0, 0.0) == []


# -- faults -------------------------------------------------------------------------------------------------------
def test_faults_stop_a_silent_run_and_leave_out_an_option_that_ran_out_of_memory_on_its_first_run():
    state = state_of(1)
    faults = Faults(stall_timeout=30.0, max_retries=1, may_leave_out=True)
    run = running(state, Option("single", 1, 10.0), (0,))
    run.session.last_progress_at = 5.0
    assert faults.stalled(state, 20.0) == []
    [stop] = faults.stalled(state, 40.0)
    assert isinstance(stop, Stop) and stop.run is run and "no progress for 35 s" in stop.reason
    run.waiting.price = priced(("single", 1, 10.0), measured=False)
    oom = JobEnd(run.key, (0,), False, "rank 0 died", "CUDA out of memory", RankFailure(0, 1.0, "oom", OUT_OF_MEMORY))
    left = faults.left_out(run, oom)
    assert left == LeaveOut(run, "CUDA out of memory", out_of_memory=True)
    assert Faults.after_leaving_out(left, TrialPrice(WORKLOAD)) is None  # no option left: the trial fails
    readmit = Faults.after_leaving_out(left, priced(("ddp", 2, 5.0)))
    assert isinstance(readmit, Readmit) and readmit.waiting.attempts == 1 and readmit.waiting.assignment is None
    run.waiting.price = TrialPrice(None, run.waiting.price.options)  # undescribed: described late instead
    assert faults.describe_late(run, oom) == Describe(run)


def test_faults_run_again_a_trial_whose_rank_died_silently_but_not_one_that_reported_a_failure():
    state = state_of(1)
    faults = Faults(stall_timeout=None, max_retries=1, may_leave_out=False)
    run = running(state, Option("single", 1, 10.0), (0,))
    died = JobEnd(run.key, (0,), False, "rank 0 died (SIGKILL)")
    assert faults.run_again(run, died)
    run.waiting.retries = 1  # its params ran once before: max_retries reached
    assert not faults.run_again(run, died)
    run.waiting.retries = 0
    run.session.outcome = {"op": "fail", "error": "ValueError: bad", "kind": CRASH}
    assert not faults.run_again(run, died)


def test_faults_run_again_a_trial_whose_rank_0_said_first_that_it_lost_a_killed_peer():
    """Rank 1 was killed (it says nothing); rank 0's collective broke with "connection reset by peer", and its
    failure came through its session before the pool saw rank 1 go: a death, not the trial's code. On one device
    no peer can go: the trial's own error stays its own."""
    state = state_of(2)
    faults = Faults(stall_timeout=None, max_retries=1, may_leave_out=True)
    run = running(state, Option("ddp", 2, 10.0), (0, 1))
    lost = "RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:28349: Connection reset by peer"
    run.session.outcome = {"op": "fail", "error": lost, "kind": PEER_GONE}
    ended = JobEnd(run.key, (0, 1), False, "a rank failed", lost, RankFailure(0, 1.0, lost, PEER_GONE))
    assert faults.run_again(run, ended)
    assert faults.left_out(run, ended) is None  # (nor is its option blamed)
    alone = running(state_of(1), Option("single", 1, 10.0), (0,))
    alone.session.outcome = {"op": "fail", "error": lost, "kind": CRASH}  # (as one rank tells it: error_kind)
    assert not faults.run_again(alone, JobEnd(alone.key, (0,), False, "a rank failed", lost))


# -- elastic ------------------------------------------------------------------------------------------------------
def test_elastic_moves_nothing_when_off_and_records_a_move_where_it_stopped():
    state = state_of(2)
    view = view_of(state)
    run = running(state, Option("single", 1, 100.0), (0,), started=3.0)
    assert Elastic(enabled=False, engines={}).move(state, view, 10.0) is None
    run.session.checkpoint, run.session.first_step_at = {"step": 40}, 5.0
    moved = Elastic.moved(run, 20.0, 0.0)
    assert moved.run is run
    assert moved.moves == [
        {"from": "single ×1", "device_ids": [0], "started": 3.0, "at": 20.0, "at_step": 40, "setup": 2.0}
    ]
    # a trial moves only once it saved a checkpoint in this run (the proof that its objective checkpoints)
    assert Elastic(enabled=True, engines={"single": "single"}).move(state, view, 10.0) is None


# -- outcomes -----------------------------------------------------------------------------------------------------
def test_outcomes_tell_a_result_and_teach_an_unmeasured_option_early_and_once():
    state = state_of(1)
    outcomes = Outcomes()
    run = running(state, Option("single", 1, 100.0), (0,))
    run.waiting.price = priced(("single", 1, 100.0), measured=False)
    session = run.session
    session.first_step_at, session.step_seconds, session.total_steps = 2.0, 0.5, 100
    session.step = EARLY_LESSON_STEPS - 1
    assert outcomes.early_lessons(state) == []
    session.step = EARLY_LESSON_STEPS
    [learn] = outcomes.early_lessons(state)
    assert learn.early and learn.number == run.number and learn.lesson["steps"] == EARLY_LESSON_STEPS
    assert outcomes.early_lessons(state) == []  # once per trial
    session.outcome, session.step = {"op": "result", "values": [0.25]}, 100
    tell = outcomes.tell(run, JobEnd(run.key, (0,), True), state, 60.0, run_again=False)
    assert (tell.state, tell.values, tell.reason) == (TrialState.COMPLETE, [0.25], "")
    assert tell.attrs["actual_runtime"] == 60.0 and tell.learn is not None and not tell.learn.early
    assert "node" not in tell.attrs  # on one machine: no node to record
    state.nodes_seen({"": {"name": "head", "ip": "10.0.0.1"}})
    told = outcomes.tell(run, JobEnd(run.key, (0,), True), state, 60.0, run_again=False)
    assert told.attrs["node"] == {"name": "head", "ip": "10.0.0.1"}
    failed = outcomes.tell(run, JobEnd(run.key, (0,), True), state, 60.0, run_again=False, reason="sweep stopped")
    assert failed.state == TrialState.FAIL and failed.attrs["fail_reason"] == "sweep stopped" and failed.learn is None


# -- releasing ----------------------------------------------------------------------------------------------------
def test_releasing_gives_back_the_devices_no_trial_left_needs_at_the_tail_and_keeps_a_largest_node():
    nodes = ["a"] * 4 + ["b"] * 2 + ["c"] * 2
    state = SweepState(0.0, [Device("cpu", i, cores=(i,), node=n) for i, n in enumerate(nodes)])
    state.planned([])
    run = running(state, Option("ddp", 2, 100.0), (4, 5))  # on node b
    state.planned([])
    assert Releasing(enabled=False).idle(state, asking_done=True, profiling=False) is None  # (makespan mode)
    releasing = Releasing(enabled=True)
    assert releasing.idle(state, asking_done=False, profiling=False) is None  # more trials may come
    assert releasing.idle(state, asking_done=True, profiling=True) is None  # a profiling job will need devices
    late = waiting(priced(("single", 1, 50.0)), state)  # admitted: the plan is out of date
    assert releasing.idle(state, asking_done=True, profiling=False) is None
    late.assignment = Assignment(str(late.number), Option("single", 1, 50.0), 2, (6,), 100.0, 150.0)
    state.planned([late.number])
    release = releasing.idle(state, asking_done=True, profiling=False)
    assert release == Release(frozenset({7}))  # node a, the largest, is kept for a trial run again
    assert releasing.idle(state, asking_done=True, profiling=False) == release  # (until the pool takes it)
    state.release({7}, 10.0)
    assert 7 not in state.free() and list(state.topology.cluster.nodes) == [4, 2, 1] and state.plan_dirty
    assert state.held_seconds(20.0) == 8 * 20.0 - 10.0
    state.nodes_changed(state.devices, {6}, 15.0)  # node c's device 6 dies at 15 s: not billed after
    assert state.held_seconds(20.0) == 8 * 20.0 - 10.0 - 5.0
    state.nodes_changed(state.devices, set(), 15.0)
    state.planned([late.number])
    run.devices = (0, 1)  # (were it on node a, the largest: b and c could go)
    assert releasing.idle(state, asking_done=True, profiling=False) == Release(frozenset({2, 3, 4, 5}))
