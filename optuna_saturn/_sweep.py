"""One call of :meth:`SaturnExecutor.optimize`: the scheduler loop, which decides; others do.

- :class:`~optuna_saturn._bridge.StudyBridge` asks and tells the user's study;
- :class:`~optuna_saturn.runner.pool.WorkerPool` runs jobs on warm workers (a launcher, for strategies whose
  launcher must own the processes);
- :class:`~optuna_saturn._pricing.Pricer` describes trials and prices their options, measured or predicted;
- the planner places the trials that wait; :mod:`optuna_saturn._voi` says which options are worth measuring.

No batch barrier: trials are asked continuously, keeping ``lookahead`` of them asked and waiting (the sampler sees
them as pending), and every event (a job ends, a trial arrives, a measurement comes in) re-plans those that wait.
A trial starts as soon as the plan gives it devices that are free; its first steps are its option's profile if it
has none. Profiling jobs run only where the value of measuring exceeds its cost, on devices the plan leaves idle.
The loop is single-threaded; the channel's threads answer workers, under the study lock.
"""

from __future__ import annotations

import gc
import glob
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from optuna_saturn import _elastic, checkpoint
from optuna_saturn._bridge import ATTR, StudyBridge
from optuna_saturn._outbox import STORAGE_ERRORS, Outbox
from optuna_saturn._ownership import (
    Heartbeat, Owner, inherit_intermediate_values, may_run_again, recover_orphans, run_again, why_orphaned,
)
from optuna_saturn._pricing import PricedOption, Pricer, ProfileEntry, ProfileJob, TrialPrice
from optuna_saturn._queue import QUEUED_TRIALS_PER_DEVICE, ParameterNotFixed, QueuedTrial, StudyQueue
from optuna_saturn._session import TrialSession
from optuna_saturn._topology import Topology
from optuna_saturn._voi import profile_gain, worth_measuring
from optuna_saturn.channel import ChannelServer
from optuna_saturn.devices import Device, pin_cores
from optuna_saturn.estimates import RuntimeEstimator
from optuna_saturn.events import ProfileEvent, SweepListener, TrialMove, TrialProgress, TrialStart
from optuna_saturn.planner import Assignment, Job, Option, Plan, Reservation, best_resize, replan
from optuna_saturn.planner._types import option_label
from optuna_saturn.profiler import ProfileStore
from optuna_saturn.runner import LaunchedTrial, LocalRunner, build_launch
from optuna_saturn.runner.pool import JobEnd, WorkerPool
from optuna_saturn.runner.ray_cluster import RayCluster
from optuna_saturn.runner.ray_pool import RayPool
from optuna_saturn.strategy import Strategy

_logger = optuna.logging.get_logger("optuna.saturn")
_REPLAN_SECONDS = 0.1  # plans happen while devices may wait for them, and take a core: keep them short
#: The planner's backend while a device waits for the plan: its heuristics alone (greedy and moldable list
#: scheduling, a few milliseconds; the first CP-SAT plan of a process also imports OR-Tools, 0.4 s).
_URGENT_SOLVER = "list"
#: Ask the next trial when a device will have nothing to do within twice the time asking and describing a trial
#: took lately, plus this margin: it is then planned before the device frees, and asked as late as that allows.
_ASK_AHEAD_SECONDS = 0.1
#: Among options that finish the plan equally soon, prefer the one that spends fewer device-seconds: each option
#: is priced to the planner this much longer per unit of area beyond the trial's most efficient option.
_EFFICIENCY_TIE_BREAK = 0.02
#: An option nobody measured for the trial is weighed as if it took this share of its relative uncertainty longer:
#: it wins over a measured one only when it is better by more than it is likely off (a prior's 1.8x on 2 devices
#: was chosen for 4 trials and ran at 1.35x). Whether to measure it instead is the value-of-information rule's call.
_CAUTION = 0.5
#: How many trials not asked yet the planner expects (per device, at most): enough to see that more work comes.
_FUTURE_TRIALS = 4
_FUTURE = "future-"
_LOG_TAIL_LINES = 20
#: A trial whose first runs of options fail (out of memory, a strategy mismatch, a crash) is planned again on
#: other options this many times in all.
_MAX_ATTEMPTS = 3
#: A trial whose steps stopped moving for this long at least (and for half its planned runtime, and for fifty of
#: its steps) has a rank that hangs: it is stopped and run again. Its evaluation between steps must fit in that.
_MIN_STALL_SECONDS = 120.0
#: Launchers whose processes the warm workers cannot stand in for (they set up the job themselves).
_LAUNCHED = ("deepspeed", "accelerate")


@dataclass(frozen=True)
class SweepSettings:
    devices: Sequence[Device]
    strategies: Sequence[Strategy]
    solver: str
    time_limit: float
    log_dir: Path
    isolate_network: bool
    artifact_store: Any
    grace_period: float
    listeners: Sequence[SweepListener] = ()
    profile_store: ProfileStore | None = None  # None: plan from runtime estimates only
    profile_steps: tuple[int, int] = (2, 5)  # warm-up steps, timed steps
    profile_budget: float | None = None  # device-seconds of profiling jobs per sweep (None: as they pay)
    profile_only: bool = False  # measure every option, run no trial
    max_retries: int = 1  # runs again of a trial whose sweep died while it ran
    checkpoint_dir: Path | None = None  # where trials' checkpoints go (None: <log_dir>/checkpoints)
    keep_checkpoints: bool = False  # keep them after a trial ends COMPLETE or PRUNED
    stall_timeout: float | None = None  # seconds without progress after which a trial is stopped (None: derived)
    elastic: bool = True  # move a running trial that checkpoints to another option when the sweep ends sooner
    worker_memory_limit: float | None = None  # bytes: a warm worker that grows past it is replaced
    ray: RayCluster | None = None  # the Ray runner's cluster (None: the local runner, on this machine's devices)


@dataclass
class _Waiting:
    """A trial asked and described, waiting for devices."""

    trial: optuna.Trial
    price: TrialPrice
    assignment: Assignment | None = None
    planned_start: float = 0.0  # seconds since the sweep started
    planned_end: float = 0.0
    attempts: int = 0  # runs that failed under an option tried for the first time (then left out)
    moves: list[dict] = field(default_factory=list)  # where the sweep moved it from while it ran (elastic resize)
    left: tuple | None = None  # the option (its choice) its last move left: not planned for it again

    @property
    def queued(self) -> bool:
        """Described from the study's queue and still in it: taken from there when it starts."""
        return isinstance(self.trial, QueuedTrial)


@dataclass
class _Run:
    """A job on devices: a trial, or a profiling job."""

    key: str
    devices: tuple[int, ...]
    started: float  # seconds since the sweep started
    log: Path
    errors: str  # where its ranks leave their errors
    tokens: list[str]
    launched: LaunchedTrial | None = None  # when a launcher runs it instead of warm workers


@dataclass
class _TrialRun(_Run):
    waiting: _Waiting | None = None
    session: TrialSession | None = None
    reported_step: int = 0
    stalled: str = ""  # why the sweep stopped it: its ranks stopped moving


@dataclass
class _ProfileRun(_Run):
    job: ProfileJob | None = None
    sessions: dict[int, TrialSession] = field(default_factory=dict)


class Sweep:
    def __init__(
        self,
        settings: SweepSettings,
        study: optuna.Study,
        objective: Callable[..., Any],
        objective_recipe: Callable[[str], dict],
        *,
        n_trials: int | None,
        timeout: float | None,
        batch_size: int,
        callbacks: Sequence[Callable[[optuna.Study, FrozenTrial], None]] = (),
        gc_after_trial: bool = False,
    ) -> None:
        self.settings = settings
        self._callbacks = list(callbacks)
        self._gc_after_trial = gc_after_trial
        self.study = study
        self._bridge = StudyBridge(study, artifact_store=settings.artifact_store,
                                   outbox=Outbox(settings.log_dir / "outbox" / _safe(study.study_name)))
        self._objective_recipe_factory = objective_recipe
        self.n_trials = n_trials
        self.timeout = timeout
        self.lookahead = batch_size
        self._strategies = {s.name: s for s in settings.strategies}
        self._topology = Topology.of(settings.devices)
        self._cluster = self._topology.cluster
        self._lost: set[int] = set()  # devices of nodes that died (the Ray runner)
        largest = max(self._cluster.nodes)  # a trial runs inside one node
        self._estimator = RuntimeEstimator(settings.strategies, largest)
        node = None if settings.ray is None else settings.ray.nodes[0]  # (the nodes of a cluster are alike)
        self._pricer = None if settings.profile_store is None else Pricer(
            objective=objective, strategies=settings.strategies, pool=settings.devices, store=settings.profile_store,
            lock=self._bridge.lock, max_devices=largest, hardware=None if node is None else node.hardware,
            device_memory=None if node is None else node.device_memory,
        )
        self._waiting: dict[int, _Waiting] = {}
        self._running: dict[str, _Run] = {}
        self._profile_queue: list[ProfileJob] = []
        self._profiled: set[tuple[int, tuple[str, int, int]]] = set()  # (trial, choice) measured or being measured
        self._plan_dirty = False
        self._refine_plan = False  # the last plan was the heuristics' alone: the solvers refine it when they may
        self._asked = 0  # trials this sweep asked or took from the queue (it runs at most n_trials)
        self._queue = StudyQueue(self._bridge)
        self._start = time.time()
        self._run_dir = settings.log_dir / f"{_safe(study.study_name)}-{time.strftime('%Y%m%d-%H%M%S')}"
        self._listeners = list(settings.listeners)
        self._profile_seconds = 0.0  # device-seconds spent in profiling jobs
        self._profile_runs = 0
        self._profiling_runs: dict[int, list[dict]] = {}  # per trial: where and when its profiling jobs ran
        self._idle_seconds: dict[int, float] = {}  # per device: time between a job's end and the next's start
        self._device_free_since = {i: 0.0 for i in range(len(settings.devices))}
        self._server: ChannelServer | None = None
        self._recipe: dict = {}
        self._owed_a_start: set[int] | None = None  # queued trials to run although asking stopped (see its use)
        self._had_a_first_round = False  # a trial for every device: the timeout may stop asking from then on
        self._ask_seconds: list[float] = []  # how long asking and describing each trial took
        self._seen: list[list[Option]] = []  # every asked trial's options, as first priced
        self._plan_version = self._voi_version = 0  # plans made; the plan whose profiling value was judged
        self._planning_seconds = 0.0
        self._owner = Owner.of_this_process()
        #: per trial asked, the checkpoint its next run resumes from (an earlier run's of its params, or its own)
        self._resumes: dict[int, checkpoint.CheckpointRecord | None] = {}
        self._moves_due = False  # a job ended since moves were last weighed
        self._checkpoints_seen = 0  # checkpoints the running trials had saved when moves were last weighed
        self._checkpoint_root = (settings.checkpoint_dir or settings.log_dir / "checkpoints") / _safe(study.study_name)
        # whether any device can read a checkpoint another wrote: on one machine, or in a folder the user named
        # (on a cluster, one every node shares); otherwise a trial run again on another node starts over
        self._checkpoints_shared = settings.ray is None or settings.checkpoint_dir is not None

    def _notify(self, method: str, *args: Any) -> None:
        for listener in list(self._listeners):
            try:
                getattr(listener, method)(self.study, *args)
            except Exception:
                _logger.exception(f"Listener {listener!r} failed in {method}; it is dropped, the sweep goes on.")
                self._listeners.remove(listener)

    # -- the loop ---------------------------------------------------------------------------------------------------
    def run(self) -> None:
        self._bridge.tell_what_the_outbox_kept(
            lambda trial: why_orphaned(trial, self._owner, self.study.user_attrs, time.time()) is not None)
        retried = recover_orphans(self._bridge, self._owner, max_retries=self.settings.max_retries)
        if retried and self.n_trials is not None:  # n_trials counts new trials; the retries run first
            self.n_trials += len(retried)
        self._notify("on_sweep_start", [str(d) for d in self.settings.devices], self._start)
        runner = LocalRunner(grace_period=self.settings.grace_period)
        channel_host = None if self.settings.ray is None else self.settings.ray.driver_ip
        with ChannelServer(host=channel_host) as server, Heartbeat(self._bridge, self._owner):
            self._server = server
            self._recipe = self._objective_recipe_factory(server.folder)
            pool = self._new_pool(server)
            pool.start(preload=self._recipe)
            try:
                while True:
                    self._ended(pool.wait(self._wait_seconds()) + self._launches_ended(runner))
                    self._join(pool)
                    self._lose(pool.lost())
                    problem = pool.host_problem()
                    if problem:
                        raise RuntimeError(problem)
                    self._dispatch(pool, runner)
                    self._ask()
                    if self._plan_due():
                        self._plan()
                        self._dispatch(pool, runner)
                    self._note_the_first_round()
                    self._consider_moves()
                    self._profile(pool, runner)
                    self._relay_progress()
                    self._stop_stalled(pool, runner)
                    if self._asking_stopped():
                        self._leave_queued_in_the_queue(pool)
                    if not (self._waiting or self._running or self._may_ask()):
                        break
                    if self.settings.profile_only and not self._running and not self._profile_queue:
                        break
            except BaseException as exc:
                reason = "interrupted (KeyboardInterrupt)" if isinstance(exc, KeyboardInterrupt) else repr(exc)
                self._abort(pool, runner, reason)
                self._notify("on_sweep_end", self._elapsed(), True)
                raise
            finally:
                pool.close()
        self._log_summary()
        self._notify("on_sweep_end", self._elapsed(), False)

    def _new_pool(self, server: ChannelServer) -> WorkerPool | RayPool:
        strategies, largest = self.settings.strategies, max(self._cluster.nodes)
        common = dict(
            memory_limit=self.settings.worker_memory_limit, log_dir=self._run_dir / "workers",
            grace_period=self.settings.grace_period, engines={s.engine for s in strategies},
            multi_device=any(n > 1 for s in strategies for n in s.device_counts(largest)),
        )
        if self.settings.ray is not None:
            return RayPool(self.settings.ray, **common)
        return WorkerPool(self.settings.devices, server, isolate_network=self.settings.isolate_network, **common)

    def _lose(self, lost: set[int]) -> None:
        """Devices whose node died: the plan no longer counts on them (the trials that ran there ended)."""
        if lost <= self._lost:
            return
        self._lost |= lost
        for waiting in self._waiting.values():
            if waiting.assignment is not None and set(waiting.assignment.devices) & self._lost:
                waiting.assignment = None  # planned again, on the nodes left
        if not self._replan_on_the_devices_left():
            return  # nothing left to plan on: the pool reports it (host_problem) and the sweep ends
        largest = max(self._cluster.nodes)
        for number, waiting in list(self._waiting.items()):
            if not any(p.option.devices <= largest for p in waiting.price.options):
                del self._waiting[number]
                reason = (f"no option of it fits the nodes left (the largest has {largest} device(s)) once "
                          f"{len(self._lost)} device(s) were lost with their node")
                if waiting.queued:
                    _logger.warning(f"Trial {number} stays in the study's queue: {reason}.")
                    continue
                frozen = self._bridge.fail(waiting.trial, reason, attrs={"profiles": waiting.price.profiles})
                _logger.warning(f"Trial {number} failed: {reason}.")
                self._trial_ended(frozen, self._elapsed())
        _logger.warning(
            f"Devices {', '.join(str(self.settings.devices[d]) for d in sorted(lost))} are gone (their node died, or "
            "their worker could not start: the log above says which); "
            f"the sweep goes on with the {len(self.settings.devices) - len(self._lost)} others."
        )

    def _join(self, pool: WorkerPool | RayPool) -> None:
        """Devices of a node that joined the cluster: planned on from now (their workers are starting)."""
        joined = pool.joined()
        if not joined:
            return
        first = len(self.settings.devices)
        self.settings = replace(self.settings, devices=[*self.settings.devices, *joined], ray=pool.cluster)
        now = self._elapsed()
        for index in range(first, len(self.settings.devices)):
            self._device_free_since[index] = now
        self._replan_on_the_devices_left()

    def _replan_on_the_devices_left(self) -> bool:
        """The nodes and devices the plan counts on, after some were lost or joined; False if none is left."""
        topology = Topology.of(self.settings.devices, without=self._lost)
        if not topology.members:
            return False
        self._topology, self._cluster = topology, topology.cluster
        self._plan_dirty = True
        return True

    def _wait_seconds(self) -> float:
        """How long to wait for a job's end: not at all before the first trial is asked (the pool starts while
        it is described), briefly while launchers must be polled or devices wait for the pool to come up,
        longer otherwise (progress is relayed between waits)."""
        if not (self._waiting or self._running) and self._may_ask():
            return 0.0
        if any(r.launched is not None for r in self._running.values()):
            return 0.05
        return 0.05 if self._waiting and not self._running else 0.25

    def _may_ask(self) -> bool:
        """Whether the sweep may take on another trial: asked, or described from the queue."""
        if self.n_trials is not None and self._asked + self._queued_waiting() >= self.n_trials:
            return False
        return not self._asking_stopped()

    def _asking_stopped(self) -> bool:
        """``study.stop()`` (from a callback: the trials asked still run), or the timeout passed once every device
        had a trial. Plain Optuna's ``n_jobs`` threads start their first trials within moments of each other, so a
        short timeout still runs one per thread; the sweep describes each trial first (seconds, for a large
        model's imports), and a timeout shorter than that would otherwise leave devices without one."""
        if self._bridge.stop_requested:
            return True
        return self.timeout is not None and time.time() - self._start >= self.timeout and not self._first_round_due()

    def _first_round_due(self) -> bool:
        """Whether some device has yet to get its first trial: fewer trials than devices were asked (or described
        from the queue), and some device has none running or planned on it."""
        if self._had_a_first_round:
            return False
        devices = {d for members in self._topology.members for d in members}
        held = {d for run in self._running.values() for d in run.devices}
        held |= {d for w in self._waiting.values() if w.assignment is not None for d in w.assignment.devices}
        return self._asked + self._queued_waiting() < len(devices) and not devices <= held

    def _note_the_first_round(self) -> None:
        """Once every device had a trial, it stays had: a node that joins later does not reopen asking past the
        timeout."""
        self._had_a_first_round = self._had_a_first_round or not self._first_round_due()

    def _queued_waiting(self) -> int:
        return sum(w.queued for w in self._waiting.values())

    def _elapsed(self) -> float:
        return time.time() - self._start

    # -- asking ---------------------------------------------------------------------------------------------------
    def _ask(self) -> None:
        """Ask a trial whenever a device would otherwise sit idle within the look-ahead: when the plan leaves it
        free now, or within the time asking and describing a trial takes. At most ``lookahead`` asked trials wait
        at once. Asking no earlier than needed lets the sampler see as many finished trials as it can; asking no
        later keeps devices busy. Trials of the study's queue whose parameters are all fixed need no sampler:
        they are described and planned at once, up to ``QUEUED_TRIALS_PER_DEVICE`` per device (:mod:`_queue`).
        (A profile-only sweep asks all its trials at once.)"""
        to_measure: list[tuple[optuna.Trial, tuple[str, int, int]]] = []
        while self._may_ask():
            if self._room_to_describe():
                queued = self._queue.next_unseen(set(self._waiting))
                if queued is not None and self._describe_queued(queued):
                    continue
            if self.settings.profile_only:
                if len(self._waiting) >= (self.n_trials or 0):
                    break
            elif not self._ask_now():
                return
            asked_at = time.time()
            queued = self._queue.next_unseen(set(self._waiting))
            trial = self._bridge.ask_new() if queued is None else self._queue.take(queued)
            if trial is None:
                continue  # another sweep took it from the queue first
            self._own(trial)
            inherit_intermediate_values(self._bridge, trial)
            self._resumes[trial.number] = self._checkpoint_to_resume(trial)
            self._admit(trial, self._price(trial), asked_at)
            if self.settings.profile_only and trial.number in self._waiting:
                to_measure += [(trial, p.option.choice) for p in self._waiting[trial.number].price.options
                               if not p.measured]
        if to_measure:  # every trial of a profile-only sweep, in as few jobs as there are device counts
            self._profile_queue += self._pricer.profile_jobs(to_measure)

    def _ask_now(self) -> bool:
        """Whether the look-ahead asks a trial now: fewer than ``lookahead`` wait, and a device idles soon."""
        if len(self._waiting) >= self.lookahead:
            return False
        if self._plan_dirty:
            self._plan()
            if self._asking_stopped():  # past the timeout, that plan gave every device its first trial
                return False
        return self._idle_soon()

    def _own(self, trial: optuna.Trial) -> None:
        """A trial this sweep asked or took from the queue: it counts towards ``n_trials``, and is marked ours."""
        self._asked += 1
        self._bridge.set_attrs(trial, {"owner": self._owner.to_json()})

    def _room_to_describe(self) -> bool:
        """Whether a trial of the queue may be described before it is asked: there is a profile store to price
        it with, and fewer known trials wait than ``QUEUED_TRIALS_PER_DEVICE`` per device allows."""
        if self._pricer is None or self.settings.profile_only:
            return False
        return len(self._waiting) < max(self.lookahead, QUEUED_TRIALS_PER_DEVICE * len(self.settings.devices))

    def _describe_queued(self, queued: FrozenTrial) -> bool:
        """Describe and price a queued trial from its fixed parameters, leaving it in the queue; False if it is
        to be asked instead (it samples, or it is a retry)."""
        if not self._queue.may_describe(queued):
            return False
        started = time.time()
        known = QueuedTrial(queued)
        try:
            price = self._price(known)
        except ParameterNotFixed as exc:
            self._queue.samples(queued.number, str(exc))
            return False
        self._resumes[known.number] = None
        if price.options:
            self._admit(known, price, started)
            return True
        trial = self._queue.take(known)  # (to fail it, with the reason, as an asked one)
        if trial is not None:
            self._own(trial)
            self._admit(trial, price, started)
        return True

    def _admit(self, trial: optuna.Trial | QueuedTrial, price: TrialPrice, asked_at: float) -> None:
        """A trial described and priced: it waits to be planned, or fails if no option fits it."""
        self._ask_seconds.append(time.time() - asked_at)
        if not price.options:
            reason = "no strategy fits this trial on these devices (every option ran out of memory or failed)"
            frozen = self._bridge.fail(trial, reason, attrs={"profiles": price.profiles})
            _logger.warning(f"Trial {trial.number} failed: {reason}.")
            self._trial_ended(frozen, self._elapsed())
            return
        self._waiting[trial.number] = _Waiting(trial, price)
        self._seen.append(weighed([p.option for p in price.options], price.options))
        self._plan_dirty = True

    def _leave_queued_in_the_queue(self, pool: WorkerPool | RayPool) -> None:
        """The sweep asks no more: the queued trials it described and has not started are not its own (they
        stay in the queue, WAITING, for the study's next optimize), except those it owes a start: planned to start
        by now on devices whose workers were still starting. Those would be running but for the workers' start-up
        (plain Optuna's first trials start at once, and its timeout lets them finish): a timeout shorter than the
        pool's start must not leave the sweep with no trial run. Which trials are owed a start is decided once,
        when asking stops, one per device."""
        if self._owed_a_start is None:
            self._owed_a_start = set()
            now, waiting_for_workers = self._elapsed(), self._free() - pool.ready()
            planned = sorted((w for w in self._waiting.values() if w.queued and w.assignment is not None),
                             key=lambda w: (w.planned_start, w.trial.number))
            for waiting in planned:
                devices = set(waiting.assignment.devices)
                if waiting.planned_start <= now and devices <= waiting_for_workers:
                    self._owed_a_start.add(waiting.trial.number)
                    waiting_for_workers -= devices
        for number, waiting in list(self._waiting.items()):
            if waiting.queued and number not in self._owed_a_start:
                del self._waiting[number]
                _logger.info(f"Trial {number} was not started before the sweep stopped asking: it stays in the "
                             "study's queue.")

    def _idle_soon(self) -> bool:
        """Whether some device has nothing to do (no running job, no waiting trial planned on it) from now, or
        from within the time it takes to ask and describe a trial."""
        now = self._elapsed()
        horizon = _ASK_AHEAD_SECONDS + 2 * (max(self._ask_seconds[-5:]) if self._ask_seconds else 0.0)
        horizon = horizon if self._ask_seconds else 0.0  # nothing waits to be asked ahead of the first trial
        busy_until = {d: now for m in self._topology.members for d in m}
        for run in self._running.values():
            for d in set(run.devices) & busy_until.keys():
                busy_until[d] = max(busy_until[d], now + self._remaining(run, now))
        for waiting in self._waiting.values():
            if waiting.assignment is not None:
                for d in waiting.assignment.devices:
                    busy_until[d] = max(busy_until[d], waiting.planned_end)
        return min(busy_until.values()) <= now + horizon

    def _checkpoint_to_resume(self, trial: optuna.Trial) -> checkpoint.CheckpointRecord | None:
        """The checkpoint a retried trial inherited from the run the dead sweep left, if it is still on disk."""
        data = trial.user_attrs.get(ATTR + "checkpoint") if ATTR + "retry_of" in trial.user_attrs else None
        if not data:
            return None
        record = checkpoint.CheckpointRecord.from_json(data)
        if not checkpoint.exists(record):
            _logger.warning(f"Trial {trial.number} runs again from the start: its checkpoint {record.path} is gone.")
            return None
        _logger.info(f"Trial {trial.number} resumes from step {record.step} ({record.strategy} x"
                     f"{record.world_size} checkpoint in {record.path}).")
        return record

    def _resumable(self, trial: optuna.Trial, options: list[PricedOption]) -> list[PricedOption]:
        """A trial that resumes from a checkpoint runs only under options that can load it; if none can, it runs
        from the start."""
        record = self._resumes.get(trial.number)
        if record is None:
            return options
        able = [p for p in options if checkpoint.can_resume(
            record, self._strategies[p.option.strategy].engine, p.option.devices, p.option.strategy)]
        if not able:
            _logger.warning(f"Trial {trial.number} runs again from the start: none of its options can load its "
                            f"{record.format} checkpoint of {record.world_size} rank(s).")
            self._resumes[trial.number] = None
            return options
        return able

    def _price(self, trial: optuna.Trial, *, leaving: tuple | None = None) -> TrialPrice:
        """The trial's options, priced; without the option ``leaving`` (the one a move left) if others remain."""
        price = self._price_all(trial)
        others = [p for p in price.options if p.option.choice != leaving]
        if leaving is not None and others:
            price.options = others
        return price

    def _price_all(self, trial: optuna.Trial) -> TrialPrice:
        if self._pricer is None:
            return TrialPrice(None, self._resumable(
                trial, [PricedOption(o, "", None, 1.0, "estimate") for o in self._estimator.options()]))
        price = self._pricer.price(trial)
        if price.workload is None:  # cannot be described: planned from runtime estimates
            price.options = [PricedOption(o, "", None, 1.0, "estimate") for o in self._estimator.options()]
        price.options = self._resumable(trial, price.options)
        self._bridge.set_attrs(trial, {
            "options": [p.option.to_json() for p in price.options], "profiles": price.profiles,
        })
        return price

    def _reprice(self) -> None:
        """Measurements came in: every waiting trial's options are priced again."""
        if self._pricer is None:
            return
        for waiting in self._waiting.values():
            waiting.price = self._price(waiting.trial, leaving=waiting.left)
        self._plan_dirty = True

    # -- planning ---------------------------------------------------------------------------------------------------
    def _options(self, waiting: _Waiting) -> list[Option]:
        """The options the planner sees: profiles corrected by how real trials ran against theirs so far."""
        workload = waiting.price.workload
        out = []
        for priced in waiting.price.options:
            option, record = priced.option, priced.record
            if record is not None and not record.observed and workload is not None:
                loop_seconds = record.trial_steps(workload.total_steps) * record.step_seconds
                option = replace(option, runtime=self._estimator.corrected(option.runtime, loop_seconds))
            resume = self._resumes.get(waiting.trial.number)
            if resume is not None and workload is not None and workload.total_steps:
                left = max(0.0, 1.0 - resume.step / workload.total_steps)  # its steps after the checkpoint
                option = replace(option, runtime=max(option.runtime * left, 1e-3))
            out.append(option)
        return out

    def _weighed_options(self, waiting: _Waiting) -> list[Option]:
        return weighed(self._options(waiting), waiting.price.options)

    def _jobs_and_busy(self) -> tuple[list[Job], list[Reservation]]:
        now = self._elapsed()
        jobs = [Job(str(n), _tie_broken(self._fitting(self._weighed_options(w)))) for n, w in self._waiting.items()]
        busy = [self._topology.reservation(r.devices, self._remaining(r, now), r.key)
                for r in self._running.values() if not set(r.devices) & self._lost]
        return jobs + self._future_jobs(), busy

    def _future_jobs(self) -> list[Job]:
        """The trials not asked yet, as the planner should expect them: like the latest trial. Without them a
        trial asked alone gets the option that ends it soonest (all devices, say), although the trials still to
        come would make options that use the devices more efficiently finish the sweep sooner; with them, such
        options are kept for the sweep's tail, where they pay."""
        remaining = (self.n_trials - self._asked - self._queued_waiting()) if self.n_trials is not None else _FUTURE_TRIALS
        if not self._seen or remaining <= 0 or self.settings.profile_only:
            return []
        # a trial of median size among those asked so far stands for each of them
        options = sorted(self._seen, key=lambda opts: min(o.runtime * o.devices for o in opts))[len(self._seen) // 2]
        count = min(remaining, _FUTURE_TRIALS * len(self.settings.devices))
        options = self._fitting(options)
        return [Job(f"{_FUTURE}{i}", _tie_broken(options)) for i in range(count)] if options else []

    def _fitting(self, options: Sequence[Option]) -> list[Option]:
        """The options that fit a node (all, unless nodes were lost)."""
        largest = max(self._cluster.nodes)
        return [o for o in options if o.devices <= largest]

    def _plan(self) -> None:
        """Re-plan every waiting trial around the running jobs (the previous plan is kept unless a new one is
        clearly shorter). While a device has no job, the plan is what it waits for: then only the planner's
        heuristics run (milliseconds), and the solvers refine the plan once every device is busy again."""
        self._plan_dirty = self._refine_plan = False
        if not self._waiting or self.settings.profile_only:
            return
        self._plan_version += 1
        now = self._elapsed()
        jobs, busy = self._jobs_and_busy()
        previous = self._previous_plan()  # (real trials only)
        urgent = self.settings.solver == "auto" and self._a_device_is_free()
        plan = replan(
            previous, jobs, self._cluster, busy=busy,
            solver=_URGENT_SOLVER if urgent else self.settings.solver,
            time_limit=min(self.settings.time_limit, _REPLAN_SECONDS),
        )
        self._refine_plan = urgent
        real = []
        for a in plan.assignments:
            if a.job.startswith(_FUTURE):
                continue
            waiting = self._waiting[int(a.job)]
            option = next(o for o in self._options(waiting) if o.choice == a.option.choice)  # its own runtime
            a = self._topology.to_global(replace(a, option=option, end=a.start + option.runtime))
            real.append(a)
            waiting.assignment, waiting.planned_start, waiting.planned_end = a, now + a.start, now + a.end
        self._planning_seconds += time.time() - self._start - now
        shown = Plan(tuple(real), solver=plan.solver, lower_bound=plan.lower_bound, solve_seconds=plan.solve_seconds)
        self._notify("on_plan", shown, [int(a.job) for a in real], now)

    def _previous_plan(self) -> Plan | None:
        """The waiting trials' current plan, as the planner sees it (node-local devices)."""
        previous = [self._topology.to_local(w.assignment) for w in self._waiting.values() if w.assignment is not None]
        return Plan(tuple(previous)) if previous else None

    def _a_device_is_free(self) -> bool:
        return bool(self._free())

    def _plan_due(self) -> bool:
        """Whether to plan now: something changed, or the heuristics' plan is to be refined and no device waits."""
        return self._plan_dirty or (self._refine_plan and not self._a_device_is_free())

    def _remaining(self, run: _Run, now: float) -> float:
        """Seconds a running job still needs: a trial from its measured step rate when it reports one (plus what
        its profile says follows the loop), else from its planned runtime; a profiling job from its prediction."""
        if isinstance(run, _TrialRun):
            session, option = run.session, run.waiting.assignment.option
            record = run.waiting.price.option(option.choice)
            record = record.record if record is not None else None
            if session.step_seconds is not None and session.total_steps:
                workload = run.waiting.price.workload
                after = record.after_loop_seconds if record is not None else 0.0
                expected = record.trial_steps(workload.total_steps) if record and workload else 0
                total = max(session.total_steps, expected)
                return max(0.0, (total - session.step) * session.step_seconds) + after
            return max(0.0, run.started + option.runtime - now)
        return max(0.0, run.started + self._profile_seconds_estimate(run.job) - now)

    # -- starting jobs ----------------------------------------------------------------------------------------------
    def _free(self) -> set[int]:
        """Devices no job holds (their worker may still be starting), on the nodes alive."""
        held = {d for r in self._running.values() for d in r.devices}
        return set(range(len(self.settings.devices))) - held - self._lost

    def _dispatch(self, pool: WorkerPool, runner: LocalRunner) -> None:
        """Start waiting trials in plan order, each with its planned option, on free devices: the planned ones
        when they are free, any others otherwise (the devices of a node are alike), so that no device idles while
        a trial could run. A trial that must wait for more devices than are free holds back the trials planned
        after it, except those that end before it is planned to start (backfilling), so it is not starved.
        Then a trial planned for later starts now under another option if that ends it no later than planned on
        devices nobody needs before (the plan's makespan is indifferent to such idle time; the trial is not)."""
        if self.settings.profile_only:
            return
        now = self._elapsed()
        free = self._free()
        ready = pool.ready()
        measuring = {e.trial.number for r in self._running.values() if isinstance(r, _ProfileRun)
                     for e in r.job.entries}
        planned = sorted(
            (w for w in self._waiting.values() if w.assignment is not None and w.trial.number not in measuring),
            key=lambda w: (w.assignment.start, w.trial.number),
        )  # (a trial whose options are being measured waits for what they show)
        blocked_until: float | None = None
        later = []
        for waiting in planned:
            option = waiting.assignment.option
            usable = self._usable(free, ready, option)
            preferred = set(waiting.assignment.devices)
            devices = sorted(preferred) if preferred <= usable else self._topology.pick(usable, option.devices)
            fits = devices is not None
            if fits and (blocked_until is None or now + option.runtime <= blocked_until):
                if self._start_as(waiting, option, devices, pool, runner):
                    free -= set(devices)
            else:
                later.append(waiting)
                if not fits and blocked_until is None:
                    blocked_until = max(now, waiting.planned_start)
        for waiting in later:
            self._start_early(waiting, later, free, ready, now, pool, runner)

    def _start_early(
        self, waiting: _Waiting, later: list[_Waiting], free: set[int], ready: set[int], now: float,
        pool: WorkerPool, runner: LocalRunner,
    ) -> None:
        """Start ``waiting`` now under whichever option ends it soonest on free devices, if that is no later than
        its planned end and no other waiting trial is planned on those devices before then."""
        needed = {d: w.planned_start for w in later if w is not waiting for d in w.assignment.devices}
        best = None
        for option, weighed in zip(self._options(waiting), self._weighed_options(waiting)):
            end = now + weighed.runtime
            usable = {d for d in self._usable(free, ready, option) if needed.get(d, float("inf")) >= end}
            devices = self._topology.pick(usable, option.devices)
            if devices is not None and end <= waiting.planned_end and (best is None or end < best[0]):
                best = (end, option, devices)
        if best is not None:
            _, option, devices = best
            if self._start_as(waiting, option, devices, pool, runner):
                free -= set(devices)

    def _usable(self, free: set[int], ready: set[int], option: Option) -> set[int]:
        """Free devices a trial under ``option`` can use now: ready workers, or any, for a launched strategy."""
        return free if self._strategies[option.strategy].launcher in _LAUNCHED else free & ready

    def _start_as(
        self, waiting: _Waiting, option: Option, devices: list[int], pool: WorkerPool, runner: LocalRunner
    ) -> bool:
        """Start ``waiting`` under ``option`` on ``devices``; False if it was in the queue and another sweep took
        it first."""
        if waiting.queued and not self._take_from_the_queue(waiting):
            return False
        now = self._elapsed()
        waiting.assignment = replace(
            waiting.assignment, option=option, node=self._topology.node_of(devices[0]), devices=tuple(devices),
            start=0.0, end=option.runtime,
        )
        # the plan it starts under: no later than planned, and as long as its option takes
        waiting.planned_start = min(waiting.planned_start, now)
        waiting.planned_end = waiting.planned_start + option.runtime
        self._start_trial(waiting, pool, runner)
        return True

    def _take_from_the_queue(self, waiting: _Waiting) -> bool:
        """The queued trial ``waiting`` described, now taken from the queue to start; False (and forgotten) if
        another sweep took it first."""
        number = waiting.trial.number
        trial = self._queue.take(waiting.trial)
        if trial is None:
            del self._waiting[number]
            self._plan_dirty = True
            _logger.info(f"Trial {number} was taken from the study's queue by another sweep; it runs there.")
            return False
        self._own(trial)
        waiting.trial = trial
        return True

    def _start_trial(self, waiting: _Waiting, pool: WorkerPool, runner: LocalRunner) -> None:
        trial, assignment = waiting.trial, waiting.assignment
        del self._waiting[trial.number]
        strategy = self._strategies[assignment.option.strategy]
        session = TrialSession(trial, self._bridge.lock)
        key = f"trial-{trial.number}"
        spec = self._spec(session, trial.number, strategy, key, gradient_accumulation=assignment.option.gradient_accumulation)
        resume = self._resumes.get(trial.number)
        spec["checkpoint"] = {
            "dir": str(self._checkpoint_root / f"trial-{trial.number}"),
            "resume": None if resume is None else resume.to_json(),
        }
        run = _TrialRun(
            key, tuple(assignment.devices), self._elapsed(), self._run_dir / f"trial-{trial.number}.log",
            spec["errors"], [spec["token"]], waiting=waiting, session=session,
        )
        self._submit(run, spec, strategy, pool, runner)
        devices = [self.settings.devices[i] for i in run.devices]
        priced = waiting.price.option(assignment.option.choice)
        measured = "" if priced is None or priced.measured else f" (not measured yet: its first steps are its profile)"
        _logger.info(
            f"Trial {trial.number} started: {strategy.name} on {', '.join(map(str, devices))}"
            + _accumulation_note(assignment.option.gradient_accumulation) + f"{measured} (log: {run.log})"
        )
        self._notify("on_trial_start", TrialStart(
            trial.number, strategy.name, tuple(map(str, devices)), waiting.planned_start, waiting.planned_end,
            run.started,
        ))

    def _spec(
        self, session: TrialSession, number: int, strategy: Strategy, key: str, *, profile: dict | None = None,
        gradient_accumulation: int = 1,
    ) -> dict:
        token = self._server.register(session.handle)
        return {
            "channel": self._server.address, "token": token, "objective": self._recipe, "trial_number": number,
            "strategy": strategy.to_json(), "profile": profile, "gradient_accumulation": gradient_accumulation,
            "errors": os.path.join(self._server.folder, _safe(key)),
        }

    def _submit(self, run: _Run, spec: dict, strategy: Strategy, pool: WorkerPool, runner: LocalRunner) -> None:
        now = run.started
        for d in run.devices:
            self._idle_seconds[d] = self._idle_seconds.get(d, 0.0) + max(0.0, now - self._device_free_since[d])
        self._running[run.key] = run
        if strategy.launcher not in _LAUNCHED:
            pool.submit(run.key, spec, run.devices, log=run.log)
            return
        _logger.info(f"{strategy.name} needs its launcher ({strategy.launcher}) to own the processes: launching it.")
        spec_path = spec["errors"] + ".json"
        devices = [self.settings.devices[i] for i in run.devices]
        with open(spec_path, "w", encoding="utf-8") as f:
            json.dump({**spec, "devices": [d.to_json() for d in devices],
                       "pin_cores": pin_cores(self.settings.devices)}, f)
        os.chmod(spec_path, 0o600)
        launch = build_launch(strategy, devices, spec_path, isolate_network=self.settings.isolate_network)
        run.launched = runner.launch(run.key, launch, run.log)

    # -- profiling ------------------------------------------------------------------------------------------------
    def _profile(self, pool: WorkerPool, runner: LocalRunner) -> None:
        """Measure what is worth measuring, on devices the plan leaves idle now."""
        if self._pricer is None:
            return
        if not self.settings.profile_only and self._voi_version != self._plan_version and self._idle_devices(pool):
            self._voi_version = self._plan_version  # judged once per plan, when devices are idle
            self._profile_queue += self._worth_measuring()
        budget = self.settings.profile_budget
        while self._profile_queue:
            if budget is not None and self._profile_seconds >= budget:
                _logger.info(f"Profiling budget of {budget} device-seconds spent: the rest is predicted.")
                self._profile_queue.clear()
                return
            idle = self._idle_devices(pool)
            placed = ((j, self._topology.pick(idle, j.devices)) for j in self._profile_queue)
            job, devices = next(((j, d) for j, d in placed if d is not None), (None, None))
            if job is None:
                return
            self._profile_queue.remove(job)
            self._start_profile(job, tuple(devices), pool, runner)

    def _idle_devices(self, pool: WorkerPool) -> set[int]:
        """Free, ready devices that no waiting trial is planned to start on now."""
        free = self._free() & pool.ready()
        soon = {d for w in self._waiting.values() if w.assignment is not None and w.assignment.start < 0.5
                for d in w.assignment.devices}
        return free - soon if not self.settings.profile_only else free

    def _worth_measuring(self) -> list[ProfileJob]:
        """Options of waiting trials whose measurement could shorten the plan by more than it costs."""
        jobs, busy = self._jobs_and_busy()
        wanted = []
        for number, waiting in self._waiting.items():
            for priced in waiting.price.options:
                choice = priced.option.choice
                if priced.measured or (number, choice) in self._profiled or priced.uncertainty <= 0:
                    continue
                optimistic = priced.option.runtime / (1.0 + priced.uncertainty)
                gain = profile_gain(jobs, self._cluster, str(number), choice, optimistic, busy=busy)
                if gain <= 0:
                    continue
                cost = self._measurement_seconds(waiting, priced)
                if worth_measuring(gain, cost, priced.option.devices, self._cluster):
                    wanted.append((waiting.trial, choice))
                    self._profiled.add((number, choice))
                    _logger.info(
                        f"Measuring {priced.option.label} for trial {number}: it may save {gain:.1f} s of the plan "
                        f"for about {cost:.1f} s on {priced.option.devices} device(s)."
                    )
        return self._pricer.profile_jobs(wanted) if wanted else []

    def _measurement_seconds(self, waiting: _Waiting, priced: PricedOption) -> float:
        """A profiling job's predicted length: the trial's set-up and the warm-up and timed steps."""
        warmup, timed = self.settings.profile_steps
        workload = waiting.price.workload
        steps = max(workload.total_steps, 1) if workload is not None else 1
        per_step = priced.option.runtime / steps
        return per_step * (warmup + timed) + 1.0

    def _profile_seconds_estimate(self, job: ProfileJob) -> float:
        warmup, timed = self.settings.profile_steps
        total = 0.0
        for entry in job.entries:
            price = self._waiting.get(entry.trial.number)
            steps = max(entry.workload.total_steps, 1)
            for strategy in entry.strategies:
                option = price.price.option((strategy.name, job.devices, job.gradient_accumulation)) if price else None
                runtime = option.option.runtime if option is not None else 10.0
                total += runtime / steps * (warmup + timed) + 1.0
        return total

    def _start_profile(self, job: ProfileJob, devices: tuple[int, ...], pool: WorkerPool, runner: LocalRunner) -> None:
        warmup, timed = self.settings.profile_steps
        key = f"profile-{job.name}"
        sessions, specs = {}, []
        for entry in job.entries:
            session = TrialSession(entry.trial, self._bridge.lock)
            sessions[entry.trial.number] = session
            specs.append(self._spec(
                session, entry.trial.number, entry.strategies[0], key, gradient_accumulation=job.gradient_accumulation,
                profile={"warmup": warmup, "timed": timed, "strategies": [s.to_json() for s in entry.strategies],
                         "gradient_accumulation": job.gradient_accumulation},
            ))
        spec = {**specs[0], "entries": specs}
        run = _ProfileRun(key, devices, self._elapsed(), self._run_dir / f"{_safe(key)}.log", spec["errors"],
                          [s["token"] for s in specs], job=job, sessions=sessions)
        strategy = job.entries[0].strategies[0]
        self._submit(run, spec, strategy, pool, runner)
        for entry in job.entries:
            for s in entry.strategies:
                self._profiled.add((entry.trial.number, (s.name, job.devices, job.gradient_accumulation)))
                self._notify("on_profile", ProfileEvent(
                    entry.trial.number, option_label(s.name, job.devices, job.gradient_accumulation), "started"))

    def _stall_limit(self, run: _TrialRun) -> float:
        if self.settings.stall_timeout is not None:
            return self.settings.stall_timeout
        step = run.session.step_seconds or 0.0
        return max(_MIN_STALL_SECONDS, 0.5 * run.waiting.assignment.option.runtime, 50 * step)

    def _stop_stalled(self, pool: WorkerPool, runner: LocalRunner) -> None:
        """Stop every trial that has taken steps and then reported none for longer than its stall limit, or took
        no step in its stall limit plus its planned runtime: one of its ranks hangs (a deadlocked collective or
        rendezvous, a stuck data loader), or died where its peers wait for it. It is run again like the trial of a
        dead sweep (:meth:`_finish_trial`)."""
        now = time.time()
        for run in list(self._running.values()):
            if not isinstance(run, _TrialRun) or run.stalled:
                continue
            if run.session.last_progress_at is None:  # not one step yet: its set-up may take up to its runtime
                silent = now - self._start - run.started
                limit = self._stall_limit(run) + run.waiting.assignment.option.runtime
            else:
                silent, limit = now - run.session.last_progress_at, self._stall_limit(run)
            if silent > limit:
                run.stalled = f"its ranks reported no progress for {silent:.0f} s (the limit is {limit:.0f} s)"
                _logger.warning(f"Trial {run.session.trial.number}: {run.stalled}; stopping it.")
                if run.launched is not None:
                    runner.stop(run.key)
                else:
                    pool.stop(run.key, reason=run.stalled)

    # -- elastic resize ---------------------------------------------------------------------------------------------
    def _consider_moves(self) -> None:
        """Elastic resize (:mod:`optuna_saturn._elastic`): once a device freed or a running trial checkpointed,
        whether stopping one running trial at its next checkpoint and going on under another option ends the
        plan sooner than keeping every trial where it is, by more than the move costs (twice: the plan does not
        foresee prunes). At most one move is pending at a time."""
        if not self.settings.elastic or self.settings.profile_only:
            return
        runs = [r for r in self._running.values() if isinstance(r, _TrialRun)]
        checkpoints = sum(len(r.session.checkpoint_steps) for r in runs)
        due = self._moves_due or (checkpoints != self._checkpoints_seen and self._a_device_is_free())
        self._checkpoints_seen = checkpoints
        if not due or any(r.session.move_requested for r in runs):
            return
        self._moves_due = False
        now = self._elapsed()
        movable, costs = {}, {}
        engines = {name: s.engine for name, s in self._strategies.items()}
        for run in runs:
            if len(run.waiting.moves) >= _elastic.MAX_MOVES or run.session.checkpoint is None:
                continue
            options = self._options(run.waiting)
            current = next((o for o in options if o.choice == run.waiting.assignment.option.choice), None)
            if current is None:
                continue
            startup = (run.session.first_step_at - self._start - run.started) if run.session.first_step_at else 0.0
            costs[run.key] = _elastic.move_cost_seconds(run.session, startup)
            rest = _elastic.rest_of_run(run.key, run.session, options, current, self._remaining(run, now),
                                        engines=engines, cost=costs[run.key])
            if rest is not None:
                movable[run.key] = rest
        if not movable:
            return
        jobs, busy = self._jobs_and_busy()
        move = best_resize(jobs, self._cluster, busy=busy, movable=movable,
                           previous=self._previous_plan(), solver=_URGENT_SOLVER,
                           time_limit=_REPLAN_SECONDS, min_gain=costs)
        if move is None:
            return
        run = self._running[move.job]
        run.session.move_requested = True
        target = move.plan.for_job(move.job).option
        self._notify("on_trial_move", TrialMove(
            run.session.trial.number, run.waiting.assignment.option.label, target.label, "asked",
            summary=f"the plan then ends in {move.makespan:.0f} s instead of {move.kept_makespan:.0f} s (the move "
                    f"costs about {costs[move.job]:.1f} s)"))

    def _continue_moved(self, run: _TrialRun) -> None:
        """A trial stopped at its checkpoint to move: it waits again, to resume from that checkpoint under an
        option other than the one it left (the plan picks which), and stays RUNNING in the study meanwhile."""
        waiting, session = run.waiting, run.session
        number, left = session.trial.number, waiting.assignment.option
        self._resumes[number] = checkpoint.CheckpointRecord.from_json(session.checkpoint)
        price = self._price(session.trial, leaving=left.choice)
        moves = [*waiting.moves, {"from": left.label, "device_ids": list(run.devices), "started": round(run.started, 3),
                                  "at": round(self._elapsed(), 3), "at_step": int(session.checkpoint["step"])}]
        self._bridge.set_attrs(session.trial, {"moves": moves})
        self._waiting[number] = _Waiting(session.trial, price, attempts=waiting.attempts, moves=moves,
                                         left=left.choice)
        self._notify("on_trial_move", TrialMove(number, left.label, "", "stopped", step=moves[-1]["at_step"]))

    # -- ends -------------------------------------------------------------------------------------------------------
    def _launches_ended(self, runner: LocalRunner) -> list[JobEnd]:
        return [JobEnd(l.key, self._running[l.key].devices, code == 0, f"exit code {code}")
                for l, code in runner.poll() if l.key in self._running]

    def _ended(self, ends: Sequence[JobEnd]) -> None:
        measured = False
        for end in ends:
            run = self._running.pop(end.key, None)
            if run is None:
                continue
            for token in run.tokens:
                self._server.unregister(token)
            now = self._elapsed()
            for d in run.devices:
                self._device_free_since[d] = now
            self._moves_due = True
            if isinstance(run, _TrialRun):
                measured |= self._finish_trial(run, end)
            else:
                self._finish_profile(run, end)
                measured = True
            self._plan_dirty = True
        if measured:
            self._reprice()

    def _finish_trial(self, run: _TrialRun, end: JobEnd, reason: str = "", *, stopping: bool = False) -> bool:
        """Tell the study how the trial ended. Returns whether its run taught the pricing something (then the
        waiting trials are priced again)."""
        session, trial = run.session, run.session.trial
        option = run.waiting.assignment.option
        self._relay_progress_of(run)  # the last steps of a short trial land between two relays
        outcome = session.outcome or {}
        op = outcome.get("op")
        if op == "fail" and not reason and self._retry_elsewhere(run, outcome):
            return True  # an option left out for its workload
        if op == "moved" and not reason and not stopping:
            self._continue_moved(run)
            return True
        # A rank that died or hung, not the trial's code: the trial is run again (from its checkpoint)
        faulted = not stopping and (bool(run.stalled) or (op is None and not end.clean))
        if run.stalled and not reason:
            reason = run.stalled
        if not reason and op in ("fail", None):
            error = _first_rank_error(run.errors)
            if op is None and not end.clean and "died" in end.reason:  # the death first: its peers' errors follow
                reason = f"{end.reason} before reporting a result" + (f" ({error})" if error else "")
            else:
                reason = error or f"the trial's workers ended ({end.reason or 'unknown'}) before reporting a result"
        state, values = TrialState.FAIL, None
        if op == "result" and not reason:
            state, values = TrialState.COMPLETE, outcome["values"]
        elif op == "pruned" and not reason:
            state = TrialState.PRUNED
        now = self._elapsed()
        attrs = self._attrs(run, now)
        if reason:
            attrs["fail_reason"] = reason
        frozen = self._bridge.tell(trial, state, values, attrs=attrs, log=run.log)
        if frozen.state in (TrialState.COMPLETE, TrialState.PRUNED) and not self.settings.keep_checkpoints:
            self._remove_checkpoints(run)
        if frozen.state == TrialState.COMPLETE and not session.resumed_from:
            self._estimator.observe(option, now - run.started)
        learned = self._learn_from(run, frozen.state)
        if faulted and frozen.state == TrialState.FAIL:
            self._run_again(frozen)
        self._log_finished(frozen, now - run.started, reason, run.log)
        self._trial_ended(frozen, now, call_back=not stopping)
        return learned

    def _run_again(self, frozen: FrozenTrial) -> None:
        """A trial whose rank died or hung: its params run again next (``max_retries`` times at most), resuming
        from its checkpoint if it saved one. ``n_trials`` still counts new trials."""
        if not may_run_again(frozen, self.settings.max_retries):
            _logger.warning(f"Trial {frozen.number} is not run again: it ran {self.settings.max_retries + 1} times.")
            return
        run_again(self._bridge, frozen)
        if self.n_trials is not None:
            self.n_trials += 1
        _logger.warning(f"Trial {frozen.number}'s params run again as a new trial"
                        + (" from its checkpoint." if ATTR + "checkpoint" in frozen.user_attrs else "."))

    def _remove_checkpoints(self, run: _TrialRun) -> None:
        """A trial that ended needs no checkpoint: neither its own nor the one it resumed from."""
        checkpoint.remove(self._checkpoint_root / f"trial-{run.session.trial.number}")
        resume = self._resumes.get(run.session.trial.number)
        if resume is not None:
            checkpoint.remove(Path(resume.path).parent)

    def _trial_ended(self, frozen: FrozenTrial, now: float, *, call_back: bool = True) -> None:
        """What follows every trial's end: the listeners, then Optuna's callbacks and ``gc_after_trial``, in this
        process, as ``study.optimize`` does (not for trials the sweep's own interruption ended)."""
        self._notify("on_trial_end", frozen, now)
        if call_back:
            self._bridge.call_back(self._callbacks, frozen)
        self._queue.look_again()  # its params run again, or a callback enqueued trials: ahead of new trials
        if self._gc_after_trial:
            gc.collect()

    def _retry_elsewhere(self, run: _TrialRun, outcome: dict) -> bool:
        """A trial failed in a way the option, not the trial, may be at fault: it ran out of memory (the option is
        recorded as not fitting; more micro-batches may), refused the trial's code (a ``StrategyMismatch``), or
        crashed before its first step under an option nobody had run for its workload. The option is never planned
        for this workload again in the sweep, and the trial waits for another one (its parameters are kept), from
        its latest checkpoint if it saved one that another option can load, else from scratch. Returns whether it
        does."""
        waiting, option = run.waiting, run.waiting.assignment.option
        priced = waiting.price.option(option.choice)
        # a crash before the first step under an option never run for this workload: the strategy, likely
        first_run_crash = (priced is None or not priced.measured) and run.session.step == 0
        if self._pricer is None or waiting.price.workload is None or waiting.attempts >= _MAX_ATTEMPTS or not (
            outcome.get("out_of_memory") or outcome.get("mismatch") or first_run_crash
        ):
            return False
        error = _first_rank_error(run.errors) or outcome.get("error", "failed")
        if outcome.get("out_of_memory"):
            self._pricer.mark_out_of_memory(waiting.trial.number, option, error)
        else:
            self._pricer.mark_failed(waiting.trial.number, option, error)
        if run.session.checkpoint is not None and self._checkpoints_shared:  # it got that far: go on from there
            self._resumes[waiting.trial.number] = checkpoint.CheckpointRecord.from_json(run.session.checkpoint)
        price = self._price(waiting.trial, leaving=waiting.left)
        if not price.options:
            return False
        _logger.warning(
            f"Trial {waiting.trial.number} failed under {option.label}, the first run of that option for its "
            f"workload ({error}); the option is left out and the trial is planned again."
        )
        self._waiting[waiting.trial.number] = _Waiting(waiting.trial, price, attempts=waiting.attempts + 1,
                                                       moves=waiting.moves, left=waiting.left)
        return True

    def _learn_from(self, run: _TrialRun, state: TrialState) -> bool:
        """The trial's real steps are its option's profile (or correct it): later trials are priced by them.
        Returns whether it learned anything."""
        session, option = run.session, run.waiting.assignment.option
        priced = run.waiting.price.option(option.choice)
        record = priced.record if priced is not None else None
        if state != TrialState.FAIL and record is not None and session.step_seconds is not None:
            self._estimator.observe_step_rate(record.step_seconds, session.step_seconds)
        if self._pricer is None or session.step_seconds is None or state == TrialState.FAIL:
            return False
        if session.resumed_from:
            return False  # a part of the trial: its start-up and length stand for no whole run
        if session.step < min(session.total_steps or 0, 10):
            return False  # too few steps to stand for the whole loop
        startup = session.first_step_at - self._start - run.started - session.step_seconds
        tail = (session.outcome_at - session.last_progress_at) if session.outcome_at and session.last_progress_at \
            else None
        self._pricer.learn_from_run(
            session.trial.number, option, step_seconds=session.step_seconds, steps=session.step,
            startup_seconds=max(0.0, startup), tail_seconds=tail, loop_steps=session.loop_steps,
        )
        return True

    def _finish_profile(self, run: _ProfileRun, end: JobEnd) -> None:
        self._profile_seconds += (self._elapsed() - run.started) * len(run.devices)
        self._profile_runs += 1
        job = run.job
        results = {n: s.profiles for n, s in run.sessions.items()}
        reported = sum(len(v) for v in results.values())
        expected = sum(len(e.strategies) for e in job.entries)
        ended_early = any(r.get("infeasible") or r.get("stop_launch") for rs in results.values() for r in rs)
        launch_error = None
        if not end.clean and not ended_early and reported < expected:  # it died without saying why
            launch_error = _first_rank_error(run.errors) or f"the profiling job ended ({end.reason}) (log: {run.log})"
        recorded = self._pricer.record(job, results, self._start + run.started, launch_error)
        self._record_profiling_run(run)
        follow_ups = self._pricer.follow_ups(job, recorded)
        self._profile_queue += follow_ups
        for entry, strategy, record in recorded:
            self._report_profile(entry, strategy, job, record, bool(follow_ups))

    def _report_profile(
        self, entry: ProfileEntry, strategy: Strategy, job: ProfileJob, record: Any, followed_up: bool
    ) -> None:
        option = option_label(strategy.name, job.devices, job.gradient_accumulation)
        if record is None:
            text = "not reached, measured in another job" if followed_up else "not measured, so it is predicted"
        elif record.failed:
            text = f"cannot run this trial, so it is not planned for it: {record.error}"
        elif not record.feasible:
            text = f"does not fit ({record.error})"
        else:
            loops = f", {len(record.loop_steps)} loops" if len(record.loop_steps) > 1 else ""
            text = (
                f"{record.step_seconds * 1e3:.1f} ms/step, set-up {record.startup_seconds:.1f} s, "
                f"after the loop {record.tail_seconds or 0.0:.1f} s{loops}, "
                f"peak {record.peak_memory_bytes / 2**20:.0f} MiB"
            )
        log = _logger.warning if record is not None and record.failed else _logger.info
        log(f"Profiled {option} (trial {entry.trial.number}): {text}.")
        self._notify("on_profile", ProfileEvent(entry.trial.number, option, "done", text))

    def _record_profiling_run(self, run: _ProfileRun) -> None:
        """Keep where and when the job ran on its trials, so the schedule chart can show the devices' time spent
        profiling (set now on trials that still wait; a trial that ends gets them with its other attributes)."""
        for entry in run.job.entries:
            runs = self._profiling_runs.setdefault(entry.trial.number, [])
            runs.append({
                "option": run.job.name, "devices": [str(self.settings.devices[i]) for i in run.devices],
                "start": round(run.started, 3), "end": round(self._elapsed(), 3),
            })
            if entry.trial.number in self._waiting:
                self._bridge.set_attrs(entry.trial, {"profiling": runs})

    def _attrs(self, run: _TrialRun, end: float) -> dict[str, Any]:
        waiting, session = run.waiting, run.session
        option = waiting.assignment.option
        priced = waiting.price.option(option.choice)
        attrs: dict[str, Any] = {
            "strategy": option.strategy,
            "num_devices": option.devices,
            "gradient_accumulation": option.gradient_accumulation,
            "devices": [str(self.settings.devices[i]) for i in run.devices],
            "device_ids": list(run.devices),
            "planned_start": round(waiting.planned_start, 3),
            "planned_end": round(waiting.planned_end, 3),
            "planned_runtime": round(option.runtime, 3),
            "actual_start": round(run.started, 3),
            "actual_end": round(end, 3),
            "actual_runtime": round(end - run.started, 3),
            "sweep_started_at": self._start,
            "pool": [str(d) for d in self.settings.devices],
            "log": str(run.log),
            **self._node_attr(run),
            "priced_by": "measured" if priced is None or priced.measured else priced.basis,
        }
        if waiting.trial.number in self._profiling_runs:
            attrs["profiling"] = self._profiling_runs[waiting.trial.number]
        if session.objective_started_at is not None:
            attrs["objective_start"] = round(session.objective_started_at - self._start, 3)
        if session.first_step_at is not None:
            attrs["first_step"] = round(session.first_step_at - self._start, 3)
        if session.step_seconds is not None:
            attrs["step_seconds"] = round(session.step_seconds, 5)
        if session.resumed_from:
            attrs["resumed_from_step"] = session.resumed_from
        return attrs

    def _node_attr(self, run: _Run) -> dict[str, Any]:
        """``saturn:node``: the Ray node a trial ran on (its name, Ray id and IP); absent on the local runner."""
        if self.settings.ray is None:
            return {}
        return {"node": self.settings.ray.node(self.settings.devices[run.devices[0]].node).to_json()}

    def _relay_progress(self) -> None:
        for run in self._running.values():
            if isinstance(run, _TrialRun):
                self._relay_progress_of(run)

    def _relay_progress_of(self, run: _TrialRun) -> None:
        session = run.session
        if session.step != run.reported_step:
            run.reported_step = session.step
            self._notify(
                "on_trial_progress",
                TrialProgress(session.trial.number, session.step, session.total_steps, session.step_seconds),
            )

    # -- stopping -------------------------------------------------------------------------------------------------
    def _abort(self, pool: WorkerPool, runner: LocalRunner, reason: str) -> None:
        """Stop every process, then end every trial this sweep holds in a clear state."""
        trials = [r for r in self._running.values() if isinstance(r, _TrialRun)]
        _logger.warning(f"Stopping the sweep: {reason}. Stopping {len(trials)} running trial(s).")
        pool.close()
        runner.stop_all()
        try:
            for run in trials:
                self._finish_trial(run, JobEnd(run.key, run.devices, False, "stopped"),
                                   reason=f"sweep stopped: {reason}", stopping=True)
            for waiting in self._waiting.values():
                if not waiting.queued:  # (a queued one is still in the queue: the next optimize runs it)
                    self._bridge.fail(waiting.trial, f"not started: sweep stopped: {reason}")
        except STORAGE_ERRORS:  # (what it could not tell is in the outbox: the next sweep tells it)
            _logger.exception("The storage failed while the sweep stopped; the next optimize ends its trials.")
        self._running.clear()
        self._waiting.clear()

    # -- output -----------------------------------------------------------------------------------------------------
    def _log_finished(self, frozen: optuna.trial.FrozenTrial, seconds: float, reason: str, log: Path) -> None:
        if frozen.state == TrialState.COMPLETE:
            _logger.info(f"Trial {frozen.number} finished in {seconds:.1f} s with value(s) {frozen.values}.")
        elif frozen.state == TrialState.PRUNED:
            _logger.info(f"Trial {frozen.number} pruned after {seconds:.1f} s.")
        else:
            reason = reason or frozen.user_attrs.get("saturn:fail_reason", "")  # (the study refused its value)
            _logger.warning(f"Trial {frozen.number} failed after {seconds:.1f} s: {reason}\n{_tail(log)}")

    def _log_summary(self) -> None:
        wall = self._elapsed()
        stats = {
            "started_at": self._start, "wall_seconds": round(wall, 3), "trials": self._asked,
            "profiling_runs": self._profile_runs, "profiling_device_seconds": round(self._profile_seconds, 3),
            "idle_device_seconds": {str(self.settings.devices[d]): round(s, 3) for d, s in self._idle_seconds.items()},
            "planning_seconds": round(self._planning_seconds, 3),
            "describing_seconds": round(sum(self._ask_seconds), 3),
        }
        self._bridge.set_study_attr("last_sweep", stats)
        profiling = f" ({self._profile_runs} profiling jobs)" if self._profile_runs else ""
        _logger.info(f"Sweep finished in {wall:.1f} s{profiling}; logs in {self._run_dir}.")


def _first_rank_error(prefix: str) -> str | None:
    """The error of the rank that failed first: its peers' errors are usually just "connection closed"."""
    errors = []
    for path in glob.glob(glob.escape(prefix) + ".rank*.error.json"):
        with open(path, encoding="utf-8") as f:
            errors.append(json.load(f))
    if not errors:
        return None
    first = min(errors, key=lambda e: e["time"])
    return f"rank {first['rank']}: {first['error']}"


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    " + line for line in lines[-_LOG_TAIL_LINES:])


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.+," else "_" for c in name)


def weighed(options: Sequence[Option], priced: Sequence[PricedOption]) -> list[Option]:
    """``options`` (one per ``priced``) as the planner weighs them: an option nobody measured for the trial is
    lengthened by ``_CAUTION`` times its relative uncertainty."""
    return [o if p.measured else replace(o, runtime=o.runtime * (1 + _CAUTION * p.uncertainty))
            for o, p in zip(options, priced, strict=True)]


def _tie_broken(options: Sequence[Option]) -> list[Option]:
    """``options`` as the planner sees them: each a little longer the more device-seconds it spends beyond the
    most efficient one (see ``_EFFICIENCY_TIE_BREAK``)."""
    least = min(o.runtime * o.devices for o in options) or 1.0
    return [replace(o, runtime=o.runtime * (1 + _EFFICIENCY_TIE_BREAK * (o.runtime * o.devices / least - 1)))
            for o in options]


def _accumulation_note(gradient_accumulation: int) -> str:
    return f", {gradient_accumulation} micro-batches per step" if gradient_accumulation > 1 else ""
