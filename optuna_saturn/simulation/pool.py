"""A pool that runs nothing: its jobs end at virtual times, for the simulator and for fast tests of the scheduler.

Behind the same protocol as the pool of processes, it plays what real workers would do, through the same trial
sessions: a job's rank 0 says the objective started, reports its steps (so stall detection, pruning, the
remaining-time estimates and elastic moves run unchanged), saves checkpoints where the trial does, and ends with a
result, a prune, or a move. What each trial does under each option (its true runtime, its steps, where the pruner
stops it, how long a run takes to start) is its :class:`Behaviour`; faults (a rank's death, a node lost or
joined) are injected at virtual times. The clock moves only here: to the next event, or by the loop's timeout
when nothing happens before (``tick`` coarsens those wake-ups, for sweeps of many virtual hours).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optuna_saturn.clock import VirtualClock
from optuna_saturn.devices import Device
from optuna_saturn.pools.protocol import JobEnd, JobRequest, PoolBroken, whole_nodes
from optuna_saturn.training import checkpoint


@dataclass(frozen=True)
class Behaviour:
    """What one trial does in the simulated world. ``runtimes``: its true whole runtime (start-up included) per
    option choice ``(strategy, devices, micro-batches)``, had it run to its end; ``prune_at``: the share of its
    steps after which its pruner stops it (1: never)."""

    runtimes: dict[tuple[str, int, int], float]
    steps: int = 100
    prune_at: float = 1.0
    startup: float = 0.0  # seconds of every run before its first step (within its runtime)
    restart: float = 0.0  # more seconds of start-up when a run resumes from a checkpoint
    checkpoint_every: int | None = None  # steps between checkpoints (None: it never saves one)
    checkpoint_seconds: float = 0.0
    values: tuple[float, ...] = (0.0,)

    def step_seconds(self, choice: tuple[str, int, int]) -> float:
        return max(self.runtimes[choice] - self.startup, 0.0) / max(self.steps, 1)


@dataclass(frozen=True)
class Fault:
    """At virtual time ``at`` (seconds since the pool started): ``"kill"`` the worker of device ``target`` (its
    rank dies), ``"hang"`` it (its job reports no step and never ends, until it is stopped), ``"lose"`` the node
    named ``target`` (its devices are gone), or ``"join"`` the devices ``target`` (a node that joins)."""

    at: float
    kind: str
    target: Any  # a device index (kill, hang), a node's name (lose), or devices (join)


@dataclass
class _Run:
    job: JobRequest
    started: float
    step_time: float = 0.0
    loop_start: float = math.inf  # when its training loop starts (after its start-up)
    resumed: int = 0
    stop_step: float = 0.0  # where the run ends, in steps (fractional: the pruner's share)
    outcome: tuple[str, dict] = ("result", {})
    ended: bool = False
    hung: bool = False
    reported: int = -1
    profiles: list[tuple[int, dict]] = field(default_factory=list)  # profiling job: (task, message) at its end


class SimulatedPool:
    """See the module's docstring. ``behaviour`` says what trial ``number`` does."""

    def __init__(
        self,
        devices: Sequence[Device],
        clock: VirtualClock,
        behaviour: Callable[[int], Behaviour],
        *,
        ready_after: float | Sequence[float] = 0.0,
        profile_steps: tuple[int, int] = (2, 5),
        faults: Sequence[Fault] = (),
        tick: float = 0.0,
        progress_rates: bool = True,
    ) -> None:
        self.devices = list(devices)
        self._clock = clock
        self._behaviour = behaviour
        self._ready_after = ready_after
        self._profile_steps = sum(profile_steps)
        self._faults = sorted(faults, key=lambda f: f.at)
        self._tick = tick
        self._rates = progress_rates  # whether progress reports carry the step rate (a real rank's always do)
        self._events: list[tuple[float, int, str, Any]] = []  # (the payload: as each kind of event needs)
        self._order = itertools.count()
        self._up: set[int] = set()
        self._busy: dict[int, str] = {}  # device -> job key
        self._runs: dict[str, _Run] = {}
        self._lost: set[int] = set()
        self.released: set[int] = set()  # devices given back to the cluster (release)
        self._joined: list[Device] = []
        self._saved: set[str] = set()  # the checkpoints its jobs saved (in the folders the sweep gave them)
        self._origin = 0.0

    # -- the protocol -----------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._origin = self._clock.now()
        for device in range(len(self.devices)):
            self._at(self._origin + self._ready_delay(device), "ready", device)
        for fault in self._faults:
            self._at(self._origin + fault.at, "fault", fault)

    def ready(self) -> set[int]:
        return self._up - self._busy.keys() - self._lost - self.released

    def release(self, devices: set[int]) -> set[int]:
        """Whole idle nodes, as a Ray cluster gives them back."""
        nodes = whole_nodes(self.devices, devices & self.ready(), self._lost | self.released)
        given = {d for members in nodes.values() for d in members}
        self.released |= given
        return given

    def joined(self) -> list[Device]:
        joined, self._joined = self._joined, []
        return joined

    def lost(self) -> set[int]:
        return set(self._lost)

    def node_of(self, device: Device) -> dict[str, Any]:
        return {}

    #: Its checkpoints are where it says it saved them, on no disk (the loop checks only their place).
    checkpoints_on_disk = False
    shares_checkpoints = True  # (one simulated machine)

    def has_checkpoint(self, path: str) -> bool:
        return path in self._saved

    def submit(self, job: JobRequest) -> None:
        if not set(job.devices) <= self.ready():
            raise RuntimeError(f"devices {list(job.devices)} are not all ready for job {job.key!r}")
        now = self._clock.now()
        run = _Run(job, now)
        self._runs[job.key] = run
        for d in job.devices:
            self._busy[d] = job.key
        for task in job.tasks:
            task.session.handle("started", {})
        end = self._profile(run) if job.profiling else self._trial(run, now)
        self._at(end, "end", job.key)

    def wait(self, timeout: float) -> list[JobEnd]:
        now = self._clock.now()
        deadline = now + (max(timeout, self._tick) if timeout > 0 else 0.0)
        ends: list[JobEnd] = []
        if self._events and self._events[0][0] <= deadline:
            t = self._events[0][0]
            self._clock.advance_to(t)
            while self._events and self._events[0][0] <= t + 1e-9:
                _, _, kind, what = heapq.heappop(self._events)
                ends += self._happen(kind, what)
        else:
            self._clock.advance_to(deadline)
        self._report_progress()
        if self._lost and len(self._lost | self.released) == len(self.devices):
            raise PoolBroken("every node of the simulated cluster is gone")
        return ends

    def stop(self, key: str, reason: str) -> None:
        run = self._runs.get(key)
        if run is not None and not run.ended:
            self._at(self._clock.now(), "stopped", (key, reason))

    def close(self) -> None:
        self._events.clear()

    def _ready_delay(self, device: int) -> float:
        """How long the worker of ``device`` takes to start (per device, where the pool was given each)."""
        if isinstance(self._ready_after, (int, float)):
            return float(self._ready_after)
        return float(self._ready_after[device % len(self._ready_after)])

    # -- jobs -------------------------------------------------------------------------------------------------------
    def _trial(self, run: _Run, now: float) -> float:
        job, session = run.job, run.job.tasks[0].session
        behaviour = self._behaviour(session.trial.number)
        choice = (job.strategy.name, len(job.devices), job.gradient_accumulation)
        resume = (job.checkpoint or {}).get("resume")
        run.resumed = int(resume["step"]) if resume else 0
        run.step_time = behaviour.step_seconds(choice)
        startup = behaviour.startup + (behaviour.restart if resume else 0.0)
        run.loop_start = now + startup
        pruned_at = behaviour.prune_at * behaviour.steps
        run.stop_step = max(min(pruned_at, behaviour.steps), run.resumed)
        if pruned_at < behaviour.steps:
            run.outcome = ("pruned", {"message": "pruned (simulated)"})
        else:
            run.outcome = ("result", {"values": list(behaviour.values)})
        if behaviour.checkpoint_every:
            every = behaviour.checkpoint_every
            for step in range((run.resumed // every + 1) * every, math.ceil(run.stop_step), every):
                self._at(self._step_time(run, step), "checkpoint", (job.key, step, behaviour.checkpoint_seconds))
        return self._step_time(run, run.stop_step)

    def _profile(self, run: _Run) -> float:
        """A profiling job: each task's strategies timed one after another, each paying its start-up."""
        t = run.started
        for index, task in enumerate(run.job.tasks):
            behaviour = self._behaviour(task.session.trial.number)
            assert task.profile is not None  # (a profiling job's tasks each have their profile)
            for strategy in task.profile["strategies"]:
                choice = (strategy["name"], len(run.job.devices), run.job.gradient_accumulation)
                step = behaviour.step_seconds(choice)
                first_step = t + behaviour.startup + step
                t = t + behaviour.startup + step * self._profile_steps
                run.profiles.append(
                    (
                        index,
                        {
                            "strategy": strategy["name"],
                            "step_seconds": [step],
                            "objective_started_at": run.started,
                            "first_step_at": first_step,
                            "tail_seconds": 0.0,
                        },
                    )
                )
        return t

    def _step_time(self, run: _Run, step: float) -> float:
        return run.loop_start + (step - run.resumed) * run.step_time

    def _happen(self, kind: str, what: Any) -> list[JobEnd]:
        if kind == "ready":
            if what not in self._lost:
                self._up.add(what)
            return []
        if kind == "checkpoint":
            return self._checkpoint(*what)
        if kind == "end":
            run = self._runs.get(what)
            return [] if run is not None and run.hung else self._end(what)
        if kind == "stopped":
            key, reason = what
            return self._end(key, clean=False, reason=reason)
        return self._fault(what)

    def _checkpoint(self, key: str, step: int, seconds: float) -> list[JobEnd]:
        run = self._runs.get(key)
        if run is None or run.ended or run.hung:
            return []
        session = run.job.tasks[0].session
        self._progress(run, self._clock.now())
        assert run.job.checkpoint is not None  # (a trial's job, which checkpoints)
        path = str(Path(run.job.checkpoint["dir"]).resolve() / f"step-{step}")  # (as a real save records it)
        self._saved.add(path)
        record = {
            "path": path,
            "step": step,
            "format": checkpoint.DCP,
            "strategy": run.job.strategy.name,
            "world_size": len(run.job.devices),
            "saved_at": self._clock.now(),
        }
        if session.handle("checkpointed", {"record": record, "seconds": seconds}):
            run.outcome = ("moved", {"step": step})
            return self._end(key)
        return []

    def _end(self, key: str, *, clean: bool = True, reason: str = "") -> list[JobEnd]:
        run = self._runs.pop(key, None)
        if run is None or run.ended:
            return []
        run.ended = True
        for d in run.job.devices:
            self._busy.pop(d, None)
        if clean:
            for index, message in run.profiles:
                run.job.tasks[index].session.handle("profile", message)
            if not run.job.profiling:
                self._progress(run, self._clock.now())
                op, message = run.outcome
                run.job.tasks[0].session.handle(op, message)
        return [JobEnd(key, run.job.devices, clean, reason)]

    def _fault(self, fault: Fault) -> list[JobEnd]:
        if fault.kind == "join":
            first = len(self.devices)
            self.devices.extend(fault.target)
            self._joined.extend(fault.target)
            for device in range(first, len(self.devices)):
                self._at(self._clock.now() + self._ready_delay(device), "ready", device)
            return []
        if fault.kind == "lose":
            gone = {i for i, d in enumerate(self.devices) if d.node == fault.target}
            self._lost |= gone
            keys = {self._busy[d] for d in gone if d in self._busy}
            return [e for k in keys for e in self._end(k, clean=False, reason=f"node {fault.target} died")]
        key = self._busy.get(fault.target)
        if key is not None and fault.kind == "hang":
            self._progress(self._runs[key], self._clock.now())  # (its last report before it hangs)
            self._runs[key].hung = True
            return []
        return [] if key is None else self._end(key, clean=False, reason=f"the worker of device {fault.target} died")

    # -- progress ---------------------------------------------------------------------------------------------------
    def _report_progress(self) -> None:
        now = self._clock.now()
        for run in self._runs.values():
            if not run.job.profiling and not run.hung:
                self._progress(run, now)

    def _progress(self, run: _Run, now: float) -> None:
        """The steps the run has taken by ``now``, as its rank 0 reports them."""
        if run.step_time > 0:
            done = run.resumed + (now - run.loop_start) / run.step_time
        else:
            done = run.stop_step if now >= run.loop_start else run.resumed
        step = int(min(done, run.stop_step) + 1e-9)
        if step > run.resumed and step != run.reported:
            run.reported = step
            total = self._behaviour(run.job.tasks[0].session.trial.number).steps
            run.job.tasks[0].session.handle(
                "progress",
                {
                    "step": step,
                    "total": total,
                    "resumed": run.resumed,
                    "elapsed": (step - run.resumed) * run.step_time if self._rates else None,
                },
            )

    def _at(self, t: float, kind: str, what: object) -> None:
        heapq.heappush(self._events, (t, next(self._order), kind, what))
