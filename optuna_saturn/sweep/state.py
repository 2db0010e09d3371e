"""What a sweep knows: the trials that wait, the jobs that run, the devices it plans on.

The policies read it and return decisions; the loop and its effects carry them out, and the transitions below
are the only code that changes its fields (the effects fill in a waiting trial's and a run's own fields). Each
field says which decision or event writes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import optuna

from optuna_saturn.devices import Device
from optuna_saturn.planner import Assignment, Cluster
from optuna_saturn.pools.protocol import JobEnd
from optuna_saturn.pricing.prices import ProfileJob, TrialPrice
from optuna_saturn.study.queue import QueuedTrial
from optuna_saturn.study.trial_session import TrialSession
from optuna_saturn.sweep.topology import Topology
from optuna_saturn.training import checkpoint


@dataclass
class Waiting:
    """A trial asked and described, waiting for devices. ``price`` is written by re-pricing, ``assignment``
    and the planned times by planning."""

    trial: optuna.Trial | QueuedTrial
    price: TrialPrice
    assignment: Assignment | None = None
    planned_start: float = 0.0  # seconds since the sweep started
    planned_end: float = 0.0
    attempts: int = 0  # runs that failed under an option tried for the first time (then left out)
    moves: list[dict] = field(default_factory=list)  # where the sweep moved it from while it ran (elastic resize)
    left: tuple | None = None  # the option (its choice) its last move left: not planned for it again
    retries: int = 0  # runs of its params before this trial (saturn:retries), read when it was taken in
    asked_at: float = 0.0  # seconds since the sweep started, when it was asked (or described from the queue)
    describe_seconds: float = 0.0  # how long asking and describing it took the loop
    #: its prices while it waited, as ``saturn:prices`` records them: [the trial whose run taught the change (-1: as
    #: first priced; None: a profiling job), its options]
    price_history: list[list] = field(default_factory=list)
    number: int = field(init=False)

    def __post_init__(self) -> None:
        self.number = self.trial.number

    @property
    def queued(self) -> bool:
        """Described from the study's queue and still in it: taken from there when it starts."""
        return isinstance(self.trial, QueuedTrial)


@dataclass
class Run:
    """A job on devices: a trial, or a profiling job."""

    key: str
    devices: tuple[int, ...]
    started: float  # seconds since the sweep started
    log: Path


@dataclass
class TrialRun(Run):
    waiting: Waiting
    session: TrialSession
    reported_step: int = 0
    stalled: str = ""  # why the sweep stopped it: its ranks stopped moving

    @property
    def number(self) -> int:
        return self.waiting.number

    @property
    def assignment(self) -> Assignment:
        """The assignment it runs under: the start sets it, and nothing clears it while the trial runs."""
        if self.waiting.assignment is None:
            raise RuntimeError(f"trial {self.number} runs without an assignment")
        return self.waiting.assignment


@dataclass
class ProfileRun(Run):
    job: ProfileJob
    sessions: dict[int, TrialSession]


@dataclass
class SweepState:
    """The sweep's state. ``started_at`` is the clock's time at the start; every other time is relative to it."""

    started_at: float
    devices: list[Device]  # the pool's, in order; grows when a node joins (faults: Join)
    lost: set[int] = field(default_factory=set)  # devices of nodes that died (faults: Lose)
    released: dict[int, float] = field(default_factory=dict)  # devices given back to the cluster, and when (releasing)
    joined_at: dict[int, float] = field(default_factory=dict)  # per device: when the pool had it (nodes join later)
    lost_at: dict[int, float] = field(default_factory=dict)  # per device lost with its node: when (faults: Lose)
    topology: Topology = field(init=False)  # the nodes the plan counts on (faults: Join, Lose)
    waiting: dict[int, Waiting] = field(default_factory=dict)  # admitted by asking, left by dispatch and ends
    running: dict[str, TrialRun | ProfileRun] = field(default_factory=dict)  # started by dispatch and profiling
    #: per trial asked, the checkpoint its next run resumes from (written by intake, ends and elastic moves)
    resumes: dict[int, checkpoint.CheckpointRecord | None] = field(default_factory=dict)
    asked: int = 0  # trials this sweep asked or took from the queue (asking)
    n_trials: int | None = None  # how many to run; retries add one each (ends: RunAgain)
    n_jobs: int | None = None  # the most trials running at once (``optimize(n_jobs=)``; None: one per device)
    plan_dirty: bool = False  # something changed since the last plan (every transition; planning clears it)
    plan_order: list[int] = field(default_factory=list)  # the planned trials, by planned start (planning)
    plans: int = 0  # plans made (planning; profiling judges what to measure once per plan)
    changes: int = 0  # counts what changes plans besides ends and arrivals: prices, nodes
    free_since: dict[int, float] = field(default_factory=dict)  # per device: when its last job ended
    idle_seconds: dict[int, float] = field(default_factory=dict)  # per device: time between jobs
    ready_at: dict[int, float] = field(default_factory=dict)  # per device: when its worker was first ready
    spent: float = 0.0  # device-seconds of the jobs that ended, trials and profiling jobs alike (ends)
    recorded_pool: tuple[str, ...] = ()  # the pool as a trial's saturn:pool last recorded it (ends)
    #: per node name, the node as a trial's saturn:node records it (the pool's word: at the start, and as nodes join)
    nodes: dict[str, dict] = field(default_factory=dict)
    all_ready_noted: bool = False  # every device's worker was up once, and the loop said so (note_ready)
    #: the exception the objective raised that ``catch`` does not list (:mod:`optuna_saturn.raised`): no trial
    #: starts after it, and ``optimize`` raises it once the running ones ended (ends: StopOnError)
    raised: dict | None = None

    def __post_init__(self) -> None:
        self.topology = Topology.of(self.devices)
        self.free_since = {i: 0.0 for i in range(len(self.devices))}
        self.joined_at = dict(self.free_since)

    @property
    def cluster(self) -> Cluster:
        return self.topology.cluster

    @property
    def largest_node(self) -> int:
        return self.topology.largest_node

    def free(self) -> set[int]:
        """Devices no job holds (their worker may still be starting), on the nodes alive."""
        held = {d for r in self.running.values() for d in r.devices}
        return set(range(len(self.devices))) - held - self.gone

    @property
    def all_asked(self) -> bool:
        """Every trial ``n_trials`` asks for was asked (more come only as runs again)."""
        return self.n_trials is not None and self.asked >= self.n_trials

    @property
    def gone(self) -> set[int]:
        """Devices no job runs on again: lost with their node, or given back."""
        return self.lost | set(self.released)

    def held_seconds(self, now: float) -> float:
        """Device-seconds the pool held its devices for, by ``now``: what a cluster bills, idle time included."""
        ends = {**self.lost_at, **self.released}
        return sum(ends.get(d, now) - since for d, since in self.joined_at.items())

    def trial_runs(self) -> list[TrialRun]:
        return [r for r in self.running.values() if isinstance(r, TrialRun)]

    def queued_waiting(self) -> int:
        return sum(w.queued for w in self.waiting.values())

    # -- transitions (the loop's and its effects') ----------------------------------------------------------------
    def took(self) -> None:
        """The sweep asked a trial, or took one from the study's queue: it counts towards ``n_trials``."""
        self.asked += 1

    def runs_again(self, count: int = 1) -> None:
        """Trials run again (their rank died, or their sweep did): ``n_trials`` counts new trials."""
        if self.n_trials is not None:
            self.n_trials += count

    def resume_from(self, number: int, record: checkpoint.CheckpointRecord | None) -> None:
        """Trial ``number``'s next run resumes from ``record`` (None: from the start)."""
        self.resumes[number] = record

    def planned(self, order: list[int] | None) -> None:
        """A plan was made (``order``: the planned trials by planned start), or found not needed (None)."""
        self.plan_dirty = False
        if order is not None:
            self.plan_order = order
            self.plans += 1

    def priced_again(self) -> None:
        """The waiting trials' prices changed: they are planned again."""
        self.plan_dirty = True
        self.changes += 1

    def unplan(self, numbers: Sequence[int]) -> None:
        """These trials lose their planned places (their devices were lost)."""
        for number in numbers:
            self.waiting[number].assignment = None

    def abandoned(self) -> None:
        """The sweep stopped: it holds no trial any more."""
        self.running.clear()
        self.waiting.clear()

    def admit(self, waiting: Waiting) -> None:
        self.waiting[waiting.number] = waiting
        self.plan_dirty = True

    def forget(self, number: int) -> Waiting | None:
        """A waiting trial the sweep no longer holds (taken by another sweep, left in the queue, failed)."""
        self.plan_dirty = True
        return self.waiting.pop(number, None)

    def launched(self, run: TrialRun | ProfileRun) -> None:
        """``run`` started: its trial no longer waits (and its devices' workers were ready, at the latest now)."""
        for d in run.devices:
            self.idle_seconds[d] = self.idle_seconds.get(d, 0.0) + max(0.0, run.started - self.free_since[d])
            self.ready_at.setdefault(d, run.started)
        if isinstance(run, TrialRun):
            self.waiting.pop(run.number, None)
        self.running[run.key] = run

    def ended(self, ends: Sequence[JobEnd], now: float) -> list[tuple[TrialRun | ProfileRun, JobEnd]]:
        """The runs that ``ends`` ended (others' ends are not this sweep's), their devices free from ``now``."""
        ended = []
        for end in ends:
            run = self.running.pop(end.key, None)
            if run is not None:
                self.spent += len(run.devices) * max(0.0, now - run.started)
                for d in run.devices:
                    self.free_since[d] = now
                self.plan_dirty = True
                ended.append((run, end))
        return ended

    def spent_by(self, now: float) -> float:
        """Device-seconds spent by ``now``: the jobs that ended, and the running ones so far."""
        return self.spent + sum(len(r.devices) * max(0.0, now - r.started) for r in self.running.values())

    def pool_to_record(self) -> list[str] | None:
        """The pool's devices when no trial recorded them yet, or they changed (a node joined or died); None
        otherwise. One trial per pool carries them (``saturn:pool``), not every trial: 64 devices repeated on
        100,000 trials would be 73 MiB of the study."""
        pool = tuple(str(d) for d in self.devices)
        if pool == self.recorded_pool:
            return None
        self.recorded_pool = pool
        return list(pool)

    def note_ready(self, ready: set[int], now: float) -> bool:
        """When each device's worker was first ready; True once every device's is, the first time (a device whose
        first job started at once, never seen idle, counts: :meth:`launched` noted it)."""
        for device in ready:
            self.ready_at.setdefault(device, now)
        if self.all_ready_noted or len(self.ready_at) < len(self.devices):
            return False
        self.all_ready_noted = True
        return True

    def nodes_seen(self, records: dict[str, dict]) -> None:
        """What the pool says of its nodes (by name), for the trials that run there to record."""
        self.nodes.update(records)

    def nodes_changed(self, devices: Sequence[Device], lost: set[int], now: float) -> bool:
        """The devices (a node joined) or the lost ones (a node died) changed; False if no device is left."""
        for index in range(len(self.devices), len(devices)):
            self.free_since[index] = self.joined_at[index] = now
        self.lost_at.update({d: now for d in set(lost) - self.lost})
        self.devices, self.lost = list(devices), set(lost)
        return self._devices_changed()

    def release(self, devices: set[int], now: float) -> None:
        """``devices`` were given back to the cluster: no plan counts on them again."""
        self.released.update({d: now for d in devices})
        self._devices_changed()

    def _devices_changed(self) -> bool:
        topology = Topology.of(self.devices, without=self.gone)
        if not topology.members:
            return False
        self.topology = topology
        self.plan_dirty = True
        self.changes += 1
        return True
