"""The SLURM pool's warm workers: one :class:`~optuna_saturn.pools.slurm_node.SlurmNodeWorkers` per node of the
allocation (a pool host started on its node by ``srun``, a warm worker per device), behind one
:class:`~optuna_saturn.pools.warm_backend.WarmBackend` that numbers all the nodes' devices in a row.

- **Jobs** run inside one node (their ranks meet through a file rendezvous there, gloo over its loopback); the
  channel to the executor crosses nodes: TCP to the executor's address on the nodes' network
  (:attr:`SlurmWorkers.channel_host`), each node's workers with their own token.
- **A node lost.** SLURM says so (``scontrol show node``: DOWN, looked at every :data:`NODE_CHECK_SECONDS`), or the
  step of its host ends: its devices are lost, its running jobs end unclean with the reason (the sweep runs their
  trials again on the nodes left), and its workers are refused from then on. A killed ``slurmd`` kills no process
  and closes no connection: SLURM's verdict is what tells (about 30 s with ``SlurmdTimeout=10``).
- **A node given back** (a deadline's or a budget's release: :meth:`SlurmWorkers.release`): its host and workers
  stop, then the job shrinks without it (:mod:`optuna_saturn.pools.slurm_job`), so SLURM shows it IDLE while the
  sweep runs on. A node an earlier sweep gave back is not the job's any more: its devices are lost from the start.
- **A job the pool asked for itself** (``SlurmPool(nodes=...)`` outside an allocation) ends when the pool closes
  (:class:`~optuna_saturn.pools.slurm_request.SlurmRequest`).
"""

from __future__ import annotations

import os
import queue
import secrets
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna

from optuna_saturn.channel import ChannelServer
from optuna_saturn.devices import Device
from optuna_saturn.leases import LEASES_ENV
from optuna_saturn.pools.protocol import JobEnd, whole_nodes
from optuna_saturn.pools.slurm_allocation import Allocation, scontrol
from optuna_saturn.pools.slurm_job import fixed_node, job_fields, shrink
from optuna_saturn.pools.slurm_node import SlurmNodeWorkers

_logger = optuna.logging.get_logger("optuna.saturn.runner")

#: Seconds between two looks at the nodes' states.
NODE_CHECK_SECONDS = 2.0


class SlurmWorkers:
    """Warm workers on ``allocation``'s nodes; see the module's docstring. Used from the sweep's thread only."""

    #: Each node may have its own disk: a checkpoint is read elsewhere only from a folder every node mounts.
    shares_checkpoints = False

    def __init__(
        self,
        allocation: Allocation,
        *,
        log_dir: Path,
        study: str = "",
        on_close: Callable[[], None] | None = None,
        **common: Any,
    ) -> None:
        self.allocation = allocation
        self._on_close = on_close  # (what ends a job the pool asked for: called last)
        self.devices: list[Device] = allocation.devices
        self._ended: queue.Queue = queue.Queue()
        common_config = host_config(study)
        self._nodes = [
            SlurmNodeWorkers(
                allocation.job_id, node, log_dir=log_dir, ended=self._ended, host_config=dict(common_config), **common
            )
            for node in allocation.nodes
        ]
        self._where = [(pool, local) for pool in self._nodes for local in range(len(pool.devices))]
        self._first = {id(pool): self._where.index((pool, 0)) for pool in self._nodes}
        self._jobs: dict[Any, tuple[int, ...]] = {}  # job -> its devices, as the sweep numbers them
        self._watch = NodeWatch([n.name for n in allocation.nodes])
        self._released: set[str] = set()  # nodes given back to SLURM (release)
        self._fixed: tuple[str | None] | None = None  # (the node that cannot leave the job, once SLURM said)

    @property
    def channel_host(self) -> str:
        """The executor's address on the nodes' network."""
        return self.allocation.channel_host

    def node_of(self, device: Device) -> dict[str, Any]:
        return {**self.allocation.node(device.node).to_json(), "slurm_job": self.allocation.job_id}

    def start(self, channel: ChannelServer, preload: dict | None = None) -> None:
        try:
            self._start(channel, preload)
        except BaseException:
            self.close()  # (a job the pool asked for ends here: the sweep closes only a started pool)
            raise

    def _start(self, channel: ChannelServer, preload: dict | None) -> None:
        held = set(scontrol(["show", "hostnames", job_fields(self.allocation.job_id).get("NodeList", "")]).split())
        for pool in self._nodes:
            if pool.node.name not in held:  # (an earlier sweep gave it back)
                pool.lost_because = f"SLURM node {pool.node.name} is not SLURM job {self.allocation.job_id}'s any more"
                continue
            pool.start(channel, preload)
        self._watch.start()
        _logger.info(
            f"SLURM pool (job {self.allocation.job_id}): {len(self.devices)} devices on {len(self._nodes)} nodes "
            f"({', '.join(f'{p.node.name}: {len(p.devices)}' for p in self._nodes)}); their workers are starting."
        )

    def close(self) -> None:
        self._watch.stop()
        try:
            for pool in self._active():
                pool.close()
        finally:
            if self._on_close is not None:
                self._on_close()

    def _active(self) -> list[SlurmNodeWorkers]:
        """The nodes not given back."""
        return [pool for pool in self._nodes if pool.node.name not in self._released]

    def _devices_of(self, pools: list[SlurmNodeWorkers]) -> set[int]:
        return {self._first[id(pool)] + i for pool in pools for i in range(len(pool.devices))}

    def _fixed_node(self) -> str | None:
        """The node that cannot leave the job (see :mod:`~optuna_saturn.pools.slurm_job`), asked once SLURM answers
        (raises where ``scontrol`` fails: asked again at the next release)."""
        if self._fixed is None:
            self._fixed = (fixed_node(self.allocation.job_id),)
        return self._fixed[0]

    # -- devices --------------------------------------------------------------------------------------------------
    def ready(self) -> set[int]:
        self._check_nodes()
        return {self._first[id(pool)] + i for pool in self._active() for i in pool.ready()}

    def joined(self) -> list[Device]:
        return []  # (an allocation's nodes are fixed)

    def lost(self) -> set[int]:
        return {
            self._first[id(pool)] + i
            for pool in self._active()
            for i in (range(len(pool.devices)) if pool.lost_because is not None else pool.lost())
        }

    def release(self, devices: set[int]) -> set[int]:
        """Whole nodes all of whose devices are idle and offered: their host and workers stop, and the job shrinks
        without them (see the module's docstring), so SLURM has them back. A batch job's script's node stays."""
        gone = self.lost() | (self._devices_of(self._nodes) - self._devices_of(self._active()))
        given: set[int] = set()
        try:
            fixed = self._fixed_node()
        except RuntimeError as exc:  # (scontrol failed or timed out: nothing goes back this time; the sweep runs on)
            _logger.warning(f"SLURM job {self.allocation.job_id}'s nodes are not given back now: {exc}")
            return given
        for name, members in whole_nodes(self.devices, devices & self.ready(), gone).items():
            keep = [p.node.name for p in self._active() if p.node.name != name]
            if name == fixed or all(p.lost_because is not None for p in self._active() if p.node.name in keep):
                continue  # (the sweep keeps a node to run on)
            pool = next(p for p in self._nodes if p.node.name == name)
            pool.close()  # (before the shrink: SLURM would end its host's step unclean)
            try:
                shrink(self.allocation.job_id, keep)
            except RuntimeError as exc:  # (still the job's, and billed; its host is stopped: its devices are lost)
                why = f"SLURM node {name} could not be given back ({exc}); its host is stopped"
                _logger.warning(f"{why}: the sweep no longer uses it, and the job still holds it.")
                pool.lost_because = why
                break  # (SLURM would refuse the next node too: its host is not stopped for nothing)
            self._released.add(name)
            given |= members
            _logger.info(
                f"SLURM node {name}'s {len(members)} device(s) are given back: SLURM job {self.allocation.job_id} "
                f"holds {', '.join(keep)} now."
            )
        return given

    def host_problem(self) -> str | None:
        self._check_nodes()
        reasons = [pool.lost_because for pool in self._active()]
        if all(reasons):
            return f"every node of SLURM job {self.allocation.job_id} is gone ({reasons[0]})"
        return None

    # -- jobs -----------------------------------------------------------------------------------------------------
    def submit(self, key: Any, job: dict, devices: Sequence[int], *, log: Path) -> None:
        pools = {id(self._where[d][0]) for d in devices}
        if len(pools) != 1:
            raise ValueError(f"job {key!r} spans several nodes ({list(devices)}); a job runs inside one node")
        pool = self._where[devices[0]][0]
        self._jobs[key] = tuple(devices)
        pool.submit(key, job, [self._where[d][1] for d in devices], log=log)

    def wait(self, timeout: float) -> list[JobEnd]:
        """Jobs that ended since the last call (on any node); waits up to ``timeout`` for the first."""
        self._check_nodes()
        active = self._active() or self._nodes
        for pool in active[1:]:
            pool.check_workers()
        ends = active[0].wait(timeout)  # (every node's jobs end into the one queue it waits on)
        return [self._global(end) for end in ends]

    def stop(self, key: Any, reason: str = "stopped") -> None:
        if key in self._jobs:
            self._where[self._jobs[key][0]][0].stop(key, reason)

    def _global(self, end: JobEnd) -> JobEnd:
        devices = self._jobs.pop(end.key, end.devices)
        return JobEnd(end.key, devices, end.clean, end.reason, end.error, end.failure)

    def _check_nodes(self) -> None:
        """Lose the nodes SLURM says are down, and those whose host's step ended."""
        down = self._watch.down()
        for pool in self._active():
            if pool.lost_because is not None:
                continue
            why = down.get(pool.node.name) or pool.host_ended()
            if why is not None:
                pool.lose(f"SLURM node {pool.node.name} is lost: {why}")
                _logger.warning(
                    f"SLURM node {pool.node.name} is lost ({why}): its {len(pool.devices)} device(s) are gone; "
                    "its trials run again on the nodes left."
                )


def host_config(study: str) -> dict[str, Any]:
    """What every node's host of one sweep is told, besides the local pool's config: for the leases it takes."""
    return {
        "sweep": secrets.token_hex(8),  # (one sweep's hosts on one machine, a test cluster's, share its leases)
        "study": study,
        "leases": os.environ.get(LEASES_ENV),  # (the executor's choice: a folder, or off)
        "pool": "SLURM",  # (how a sweep waiting for one of its leases is told who holds it)
    }


class NodeWatch:
    """SLURM's word on the allocation's nodes, asked in a thread of its own (``scontrol`` may be slow to answer: the
    sweep's loop never waits for it)."""

    def __init__(self, names: list[str]) -> None:
        self._names = names
        self._down: dict[str, str] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="saturn-slurm-nodes", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def down(self) -> dict[str, str]:
        """The nodes SLURM says are down, and why."""
        return dict(self._down)

    def _run(self) -> None:
        while not self._stopped.wait(NODE_CHECK_SECONDS):
            try:
                answer = scontrol(["--oneliner", "show", "node", ",".join(self._names)])
            except RuntimeError:
                continue  # (slurmctld busy: asked again next time)
            self._down.update(down_nodes(answer, self._names))


def down_nodes(answer: str, names: list[str]) -> dict[str, str]:
    """Of ``names``, the nodes ``scontrol --oneliner show node`` (``answer``) says are down or failed, and why."""
    down = {}
    for line in answer.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        state = fields.get("State", "")
        if fields.get("NodeName") in names and ("DOWN" in state or "FAIL" in state):
            reason = line.partition("Reason=")[2].strip()
            down[fields["NodeName"]] = f"SLURM says it is {state}" + (f" ({reason})" if reason else "")
    return down
