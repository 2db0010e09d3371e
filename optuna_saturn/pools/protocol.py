"""The one protocol between the sweep and whatever runs its jobs (DESIGN.md decision 12).

A pool runs jobs on devices: a trial, or a profiling run of one or several trials, as one process group over the
job's devices. The sweep's loop submits jobs, waits for their ends and stops them; it never asks how a pool does
it. Two pools implement it:

- :class:`~optuna_saturn.pools.processes.ProcessPool`: real processes, through a warm backend
  (:class:`~optuna_saturn.pools.warm_backend.WarmBackend`: this machine's workers, or a Ray cluster's), or a
  launcher for strategies whose launcher must own the processes;
- :class:`~optuna_saturn.simulation.pool.SimulatedPool`: jobs that end at virtual times, for the simulator and
  for tests of scheduling rules that need no process.

A job's ranks talk to the sweep through its trials' sessions (:class:`~optuna_saturn.study.trial_session.
TrialSession`): a real pool relays them over the channel, the simulated pool writes into them directly, so what
the loop reads (steps, checkpoints, outcomes) is the same either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from optuna_saturn.devices import Device
from optuna_saturn.strategy import Strategy
from optuna_saturn.study.trial_session import TrialSession
from optuna_saturn.worker.failures import RankFailure


@dataclass(frozen=True)
class Task:
    """One trial's part of a job: the session its rank 0 talks to, the strategy it runs under, and, for a
    profiling run, what to time (``{"warmup", "timed", "strategies", "gradient_accumulation"}``)."""

    session: TrialSession
    strategy: Strategy
    profile: dict | None = None


@dataclass(frozen=True)
class JobRequest:
    """A job to run on ``devices`` (global indices, all on one node): a trial run (one task) or a profiling run
    (one task per trial it times, one after another). ``key`` is unique in the sweep."""

    key: str
    devices: tuple[int, ...]
    tasks: tuple[Task, ...]
    log: Path
    gradient_accumulation: int = 1
    checkpoint: dict | None = None  # {"dir": where it saves, "resume": the record it resumes from, or None}

    @property
    def strategy(self) -> Strategy:
        return self.tasks[0].strategy

    @property
    def profiling(self) -> bool:
        return self.tasks[0].profile is not None


@dataclass(frozen=True)
class JobEnd:
    """A job's ranks are done with it. ``clean``: every rank finished it normally (the trial may still have
    failed: its outcome came through its session); otherwise ``reason`` says which rank died or was stopped, and
    ``error`` is the error of the rank that failed first, if one said (its peers' are usually "connection
    closed"), and ``failure`` that rank's failure with its kind (out of memory, mismatch, crash)."""

    key: str
    devices: tuple[int, ...]
    clean: bool
    reason: str = ""
    error: str | None = None
    failure: RankFailure | None = None


class PoolBroken(RuntimeError):
    """The pool can run no job any more (its host died, every node of its cluster is gone): the sweep ends."""


class Pool(Protocol):
    """What the sweep's loop needs of a pool. Used from the loop's thread only."""

    def start(self) -> None:
        """Start the workers (they come up as :meth:`ready` says)."""

    def ready(self) -> set[int]:
        """Devices whose worker is up and runs no job: a job may be submitted on them now."""

    def joined(self) -> list[Device]:
        """Devices added since the last call (a node joined the cluster), in the pool's order."""

    def lost(self) -> set[int]:
        """Devices that can no longer run jobs (their node died), in all."""

    def node_of(self, device: Device) -> dict[str, Any]:
        """The cluster node ``device`` is on, as a trial's ``saturn:node`` records it; {} on one machine."""

    #: Whether its checkpoints are files (a simulated pool's are on no disk: only their place is checked).
    checkpoints_on_disk: bool

    @property
    def shares_checkpoints(self) -> bool:
        """Whether a checkpoint saved on one of its devices can be loaded on any other (one machine: yes; a
        cluster's nodes: only from a folder they all mount, which the sweep is told by its ``checkpoint_dir``)."""

    def has_checkpoint(self, path: str) -> bool:
        """Whether the checkpoint a job saved at ``path`` can be loaded by the pool's next jobs (it is on their
        disk; a simulated pool's are wherever it says it saved them)."""

    def submit(self, job: JobRequest) -> None:
        """Run ``job`` on its devices, which must be ready; its end comes out of :meth:`wait`."""

    def wait(self, timeout: float) -> list[JobEnd]:
        """Jobs that ended since the last call; waits up to ``timeout`` seconds for the first one. Raises
        :class:`PoolBroken` when no job can run any more."""

    def stop(self, key: str, reason: str) -> None:
        """Stop a job; its end (unclean, with ``reason``) comes out of :meth:`wait`."""

    def release(self, devices: set[int]) -> set[int]:
        """Give back to the cluster what it can of ``devices`` (idle, none of them needed again in this sweep);
        returns the devices given back. A cluster rents devices by the node (a Ray node's placement group), so
        only whole nodes go; one machine's devices are not rented, and none go."""

    def close(self) -> None:
        """Stop every job and worker."""


def whole_nodes(devices: Sequence[Device], offered: set[int], gone: set[int]) -> dict[str, set[int]]:
    """The nodes (by name) all of whose devices not ``gone`` are ``offered``: what a pool that rents by the node
    can give back."""
    by_node: dict[str, set[int]] = {}
    for index, device in enumerate(devices):
        if index not in gone:
            by_node.setdefault(device.node, set()).add(index)
    return {node: members for node, members in by_node.items() if members <= offered}


@dataclass
class JobRanks:
    """A job's ranks as they end, one per device: the first failure's reason, and the job's end once all are done.
    The bookkeeping every pool of processes keeps per job."""

    key: str
    devices: tuple[int, ...]
    finished: dict[int, bool] = field(default_factory=dict, kw_only=True)  # device -> ended clean
    reason: str = field(default="", kw_only=True)

    def rank_ended(self, device: int, clean: bool, reason: str) -> None:
        self.finished[device] = clean
        if not clean:
            self.reason = self.reason or reason

    def unfinished(self) -> list[int]:
        return [d for d in self.devices if d not in self.finished]

    def end(self) -> JobEnd | None:
        """The job's end once every rank is done, else None."""
        if self.unfinished():
            return None
        return JobEnd(self.key, self.devices, all(self.finished.values()), self.reason)
