"""Where new kinds of workers plug in: warm workers that run jobs' ranks, one worker per device.

:class:`~optuna_saturn.pools.processes.ProcessPool` puts the channel, the objective's recipe, the sessions'
tokens and the first rank's error in front of a warm backend, so that a new kind of pool (Kubernetes, say)
implements only this and its :class:`~optuna_saturn.pools.kinds.PoolKind`, which builds it. Three do:
:class:`~optuna_saturn.pools.warm.WorkerPool` (this machine's devices), :class:`~optuna_saturn.pools.ray.RayWorkers`
(a Ray cluster's nodes) and :class:`~optuna_saturn.pools.slurm.SlurmWorkers` (a SLURM job's nodes).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from optuna_saturn.channel import ChannelServer
from optuna_saturn.devices import Device
from optuna_saturn.pools.protocol import JobEnd


class WarmBackend(Protocol):
    """Warm workers for a pool's devices. Used from the sweep loop's thread only."""

    @property
    def channel_host(self) -> str | None:
        """Where the channel must listen for its workers to reach it: None for this machine's loopback, else an
        address every node reaches."""

    @property
    def shares_checkpoints(self) -> bool:
        """Whether a checkpoint written on one device can be loaded on any other (one machine: yes; the nodes of
        a cluster: only from a folder they all mount, which the sweep is told separately)."""

    def start(self, channel: ChannelServer, preload: dict | None = None) -> None:
        """Start a worker per device; each talks to ``channel`` and imports ``preload`` (the objective's recipe)."""

    def ready(self) -> set[int]:
        """Devices whose worker is up and runs no job."""

    def joined(self) -> list[Device]:
        """Devices added since the last call (a node joined)."""

    def lost(self) -> set[int]:
        """Devices that can no longer run jobs, in all."""

    def node_of(self, device: Device) -> dict[str, Any]:
        """The node ``device`` is on, as ``saturn:node`` records it; {} on one machine."""

    def host_problem(self) -> str | None:
        """Why no job can run any more (the workers' host died, every node is gone), or None."""

    def submit(self, key: Any, job: dict, devices: Sequence[int], *, log: Path) -> None:
        """Run the job's ranks (``job``: the spec every rank reads) on ``devices``, which are ready."""

    def wait(self, timeout: float) -> list[JobEnd]:
        """Jobs whose ranks all ended since the last call; waits up to ``timeout`` for the first."""

    def stop(self, key: Any, reason: str = "stopped") -> None:
        """Stop a job's ranks; its end comes out of :meth:`wait`."""

    def release(self, devices: set[int]) -> set[int]:
        """Give back what it can of ``devices`` (idle, not needed again); returns what it gave back (see
        :meth:`~optuna_saturn.pools.protocol.Pool.release`)."""

    def close(self) -> None:
        """Stop every worker."""
