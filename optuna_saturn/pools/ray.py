"""The Ray runner's device pool: a warm worker per device of a Ray cluster, as a Ray actor.

It offers what :class:`~optuna_saturn.pools.warm.WorkerPool` offers the sweep (``start``, ``ready``, ``submit``,
``wait``, ``stop``, ``lost``, ``host_problem``, ``close``), with Ray in the part of the pool host:

- **Placement.** Each node's devices are one placement group, a bundle per device, held for the sweep and
  pinned to that node (``STRICT_PACK`` with a ``ray.io/node-id`` label selector). Device ``i``'s actor runs in
  its bundle, so it holds that device's CPUs (and GPU) and nothing else runs there meanwhile. It also holds the
  device's lease on its node (:mod:`optuna_saturn.pools.ray_lease`): a local sweep there waits for it, or it waits.
- **Jobs** are actor calls: a job on ``k`` devices is one ``run`` call on each of their ``k`` actors, which form a
  fresh process group for it. Its ranks are always on one node, so the rendezvous is a file in a folder of that
  node, and gloo (and NCCL) talk over the node's loopback: nothing a trial starts listens on the network.
- **The trial's channel** to the executor crosses machines: TCP to the executor's IP, authenticated by the
  trial's token (:mod:`optuna_saturn.channel`).
- **Logs and error files** come back with the call's result, into the executor's log folder, so ``saturn:log``
  and the failed-rank report work without a shared filesystem. The objective travels inside its recipe
  (:func:`optuna_saturn.worker.objective_recipe.portable`).
- **Nodes that join** are measured on arrival; their devices join the pool (:meth:`RayWorkers.joined`) and the
  sweep plans on them from its next plan.
- **Failures.** An actor that dies (its job failed and it must be replaced, ``stop``, a crash) is replaced in
  its bundle. A node that dies loses its devices (:meth:`RayWorkers.lost`): its jobs end unclean with the reason,
  and the sweep plans on the nodes left.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from optuna_saturn.channel import ChannelServer
from optuna_saturn.devices import Device
from optuna_saturn.pools.protocol import JobEnd, JobRanks
from optuna_saturn.pools.ray_actor import DeviceActor, remove_sweep_folder
from optuna_saturn.pools.ray_cluster import RayCluster, RayNode, import_ray
from optuna_saturn.pools.ray_lease import LeaseWaits, driver_leases
from optuna_saturn.pools.ray_nodes import NodeMembership, bundle, first_line
from optuna_saturn.pools.warm import COLLECTIVE_TIMEOUT_SECONDS, RENDEZVOUS_TIMEOUT_SECONDS
from optuna_saturn.worker.objective_recipe import portable

_logger = optuna.logging.get_logger("optuna.saturn.runner")

#: Failed starts in a row after which a device's actor is not started again.
START_ATTEMPTS = 3


@dataclass
class _Actor:
    handle: Any
    starting: Any  # the reference of its ``ready`` call, until it answered
    job: Any = None


@dataclass
class _RayJob(JobRanks):
    log: Path
    errors_folder: str
    stop_peers_at: float | None = None  # a rank failed: its peers still running then are stopped


class RayWorkers(NodeMembership):
    """Warm workers on ``cluster``'s devices; see the module's docstring. Used from the sweep's thread only."""

    #: Each node has its own disk: a checkpoint is read elsewhere only from a folder every node mounts.
    shares_checkpoints = False

    def __init__(
        self,
        cluster: RayCluster,
        *,
        log_dir: Path,
        grace_period: float = 5.0,
        memory_limit: float | None = None,
        multi_device: bool = True,
        engines: Sequence[str] = (),
        collective_timeout: float = COLLECTIVE_TIMEOUT_SECONDS,
        study: str = "",
    ) -> None:
        self.cluster = cluster
        self.devices: list[Device] = cluster.devices
        self._node_of = [n for n in cluster.nodes for _ in n.devices]
        self._bundle_of = [b for n in cluster.nodes for b in range(len(n.devices))]
        self._log_dir = log_dir
        self._grace = grace_period
        self._config = {
            "memory_limit": memory_limit,
            "multi_device": multi_device,
            "engines": sorted(engines),
            "sweep": secrets.token_hex(8),
            "extensions": os.environ.get("TORCH_EXTENSIONS_DIR"),
            "timeouts": {"collective": collective_timeout},
            "study": study,  # (for the device leases its actors take: who holds a device, said to other sweeps)
            "leases": driver_leases(),
        }
        self._ray: Any = None
        self._actor_class: Any = None
        self._groups: dict[str, Any] = {}  # node name -> its placement group
        self._actors: dict[int, _Actor] = {}
        self._calls: dict[Any, tuple[str, int]] = {}  # pending reference -> ("ready" | "run", device)
        self._jobs: dict[Any, _RayJob] = {}
        self._ended: collections.deque[JobEnd] = collections.deque()
        self._lost: dict[int, str] = {}  # device -> why it is gone
        self._released: set[int] = set()  # devices of the nodes given back to the cluster (release)
        self._killed: dict[int, bool] = {}  # devices whose actor this pool killed (its death is no news)
        self._suspect: dict[int, float] = {}  # devices whose actor Ray could not reach, since when
        self._start_failures: dict[int, int] = {}  # device -> failed starts in a row
        self._probes: dict[Any, dict] = {}  # a node that joined: the reference of its measurement -> its info
        self._ignored: set[str] = set()  # nodes that joined but cannot be used
        self._reserved_at: dict[str, float] = {}  # node name -> when its placement group was asked for
        self._joined: list[Device] = []  # devices of nodes that joined, not yet told to the sweep
        self._recipes: dict[str, dict] = {}
        self._rendezvous_ids = itertools.count()
        self._nodes_checked = 0.0
        self._lease_waits = LeaseWaits()

    # -- life cycle ----------------------------------------------------------------------------------------------
    @property
    def channel_host(self) -> str:
        """The driver's address, which every node reaches."""
        return self.cluster.driver_ip

    def node_of(self, device: Device) -> dict[str, Any]:
        return self.cluster.node(device.node).to_json()  # (read now: a node that joined is in it)

    def start(self, channel: ChannelServer, preload: dict | None = None) -> None:
        """Reserve every node's devices and start their actors; each imports ``preload`` (an objective recipe).
        (The actors reach ``channel`` at the address each job's spec names.)"""
        self._ray = import_ray()
        self._actor_class = self._ray.remote(DeviceActor)
        self._config["preload"] = None if preload is None else self._portable(preload)
        self._log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for node in self.cluster.nodes:
            self._reserve(node)
        for index in range(len(self.devices)):
            self._spawn(index)
        _logger.info(
            f"Ray runner: {len(self.devices)} devices on {len(self.cluster.nodes)} nodes "
            f"({', '.join(f'{n.name}: {len(n.devices)}' for n in self.cluster.nodes)}); their workers are starting."
        )

    def _reserve(self, node: RayNode) -> None:
        from ray.util.placement_group import placement_group

        self._reserved_at[node.name] = time.monotonic()
        self._groups[node.name] = placement_group(
            [bundle(node)] * len(node.devices),
            strategy="STRICT_PACK",
            name=f"optuna-saturn-{self._config['sweep']}-{node.name}",  # (two sweeps may share the cluster)
            bundle_label_selector=[{"ray.io/node-id": node.node_id}] * len(node.devices),
        )

    def close(self) -> None:
        """Stop every actor and give the nodes' devices back to the cluster."""
        if self._ray is None:
            return
        from ray.util.placement_group import remove_placement_group

        for device in self._actors:
            self._kill(device)
        cleanup = self._ray.remote(remove_sweep_folder)
        alive = self._alive_nodes() or set()
        removals = [
            cleanup.options(num_cpus=0, label_selector={"ray.io/node-id": n.node_id}).remote(self._config["sweep"])
            for n in self.cluster.nodes
            if n.node_id in alive
        ]
        with contextlib.suppress(Exception):
            self._ray.get(removals, timeout=30)
        for group in self._groups.values():
            with contextlib.suppress(Exception):
                remove_placement_group(group)
        self._actors.clear()
        self._calls.clear()

    # -- jobs -----------------------------------------------------------------------------------------------------
    def ready(self) -> set[int]:
        """Devices whose actor is up and idle."""
        return {
            i
            for i, a in self._actors.items()
            if a.starting is None and a.job is None and i not in self._lost and i not in self._suspect
        }

    def joined(self) -> list[Device]:
        """Devices of nodes that joined the cluster since the last call, in the pool's order (they follow the
        devices the pool had); their actors are starting."""
        joined, self._joined = self._joined, []
        return joined

    def lost(self) -> set[int]:
        """Devices of nodes that died: no job runs on them again in this sweep."""
        return set(self._lost)

    def host_problem(self) -> str | None:
        if self._lost and len(self._lost) + len(self._released) == len(self.devices):
            return f"every node of the Ray cluster is gone ({next(iter(self._lost.values()))})"
        if self._ray is not None and not self._ray.is_initialized():
            return "the connection to the Ray cluster was lost"
        return None

    def submit(self, key: Any, job: dict, devices: Sequence[int], *, log: Path) -> None:
        """Run ``job`` on ``devices`` (ready, and on one node); its end comes out of :meth:`wait`."""
        if len({self._node_of[d].name for d in devices}) != 1:
            raise ValueError(f"job {key!r} spans several nodes ({list(devices)}); a job runs inside one node")
        if not set(devices) <= self.ready():
            raise RuntimeError(f"devices {list(devices)} are not all ready for job {key!r}")
        log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        job = {**job, "objective": self._portable(job["objective"])}
        if "entries" in job:
            job["entries"] = [{**e, "objective": job["objective"]} for e in job["entries"]]
        rendezvous = f"rendezvous-{next(self._rendezvous_ids)}"
        self._jobs[key] = _RayJob(key, tuple(devices), log, os.path.dirname(job["errors"]))
        for rank, device in enumerate(devices):
            actor = self._actors[device]
            actor.job = key
            call = actor.handle.run.remote(
                {
                    **job,
                    "name": str(key),
                    "rank": rank,
                    "world_size": len(devices),
                    "rendezvous": rendezvous,
                    "timeout": RENDEZVOUS_TIMEOUT_SECONDS,
                    "worker": str(self.devices[device]),
                }
            )
            self._calls[call] = ("run", device)

    def wait(self, timeout: float) -> list[JobEnd]:
        """Jobs that ended since the last call; waits up to ``timeout`` seconds for the first one."""
        self._stop_overdue_peers()
        calls = [*self._calls, *self._probes]
        if calls:
            done, _ = self._ray.wait(calls, num_returns=1, timeout=timeout)
            if done:
                done, _ = self._ray.wait(calls, num_returns=len(calls), timeout=0)
            for call in done:
                self._settle(call)
        else:
            time.sleep(timeout)
        self._check_nodes()
        ended = list(self._ended)
        self._ended.clear()
        return ended

    def stop(self, key: Any, reason: str = "stopped") -> None:
        """Stop a job: its actors are killed (and replaced); its end comes out of :meth:`wait`."""
        job = self._jobs.get(key)
        if job is None:
            return
        job.reason = job.reason or reason
        for device in job.unfinished():
            self._kill(device)

    # -- what comes back -----------------------------------------------------------------------------------------
    def _settle(self, call: Any) -> None:
        if call in self._probes:
            self._welcome(self._probes.pop(call), call)
            return
        if call not in self._calls:  # (its node was lost while this round of ends was settled)
            return
        kind, device = self._calls.pop(call)
        try:
            result = self._ray.get(call)
        except self._ray.exceptions.RayError as exc:
            result, error = None, exc
        actor = self._actors[device]
        if kind == "ready":
            if result is not None and "waiting_for" in result:  # (not a failed start: another sweep has it)
                self._lease_waits.waits(str(self.devices[device]), result["waiting_for"])
                actor.starting = actor.handle.ready.remote()
                self._calls[actor.starting] = ("ready", device)
                return
            actor.starting = None
            self._lease_waits.leased(str(self.devices[device]))
            if result is None:
                self._failed_start(device, error)
            else:
                self._start_failures.pop(device, None)
            return
        if result is None:
            self._actor_died(device, error)
            return
        job = self._jobs.get(actor.job)
        if job is not None:
            with open(job.log, "a", encoding="utf-8") as f:
                f.write(result["log"])
            for name, text in result["errors"].items():
                with open(os.path.join(job.errors_folder, name), "w", encoding="utf-8") as f:
                    f.write(text)
        self._rank_ended(device, result["clean"], "" if result["clean"] else "a rank failed")
        if self._killed.pop(device, None) or result["recycle"]:  # (killed as it finished: it is gone too)
            self._replace(device)

    def _failed_start(self, device: int, error: BaseException) -> None:
        """The actor of ``device`` failed to start (its imports failed there, say): started again, up to
        :data:`START_ATTEMPTS` times in a row; then the device is lost, with the reason in the log."""
        failures = self._start_failures[device] = self._start_failures.get(device, 0) + 1
        if failures >= START_ATTEMPTS:
            self._lost[device] = f"its worker failed to start {failures} times ({first_line(error)})"
            _logger.error(f"Device {self.devices[device]} is left out: {self._lost[device]}.")
            return
        _logger.warning(f"The worker of device {self.devices[device]} failed to start ({error}); starting it again.")
        self._replace(device)

    def _rank_ended(self, device: int, clean: bool, reason: str) -> None:
        actor = self._actors.get(device)
        key = actor.job if actor is not None else None
        if actor is not None:
            actor.job = None
        job = self._jobs.get(key)
        if job is None:
            return
        job.rank_ended(device, clean, reason)
        if not clean and job.stop_peers_at is None:  # its peers may wait forever in a collective with it
            job.stop_peers_at = time.monotonic() + self._grace
        end = job.end()
        if end is not None:
            del self._jobs[key]
            self._ended.append(end)

    def _stop_overdue_peers(self) -> None:
        now = time.monotonic()
        for job in list(self._jobs.values()):
            if job.stop_peers_at is not None and now >= job.stop_peers_at:
                job.stop_peers_at = float("inf")
                for device in job.unfinished():
                    self._kill(device)

    def _actor_died(self, device: int, error: BaseException) -> None:
        """The actor of ``device`` died in a call: this pool killed it (a stopped job, a job's failed peer), its
        node died, or it crashed; or Ray cannot reach it, and whether its node died is known only once Ray's
        health check gave its verdict (seconds later): until then the device runs nothing."""
        node = self._node_of[device]
        killed = self._killed.pop(device, None) is not None
        alive = self._alive_nodes()
        if not killed and alive is not None and node.node_id not in alive:
            self._lose_node(node, f"Ray node {node.name} died")
            return
        unreachable = not killed and (
            isinstance(error, self._ray.exceptions.ActorUnavailableError) or "node" in str(error).lower()
        )
        if unreachable:
            reason = (
                f"the worker of device {self.devices[device]} became unreachable: Ray node {node.name} died "
                f"or left the cluster ({first_line(error)})"
            )
            self._suspect[device] = time.monotonic()
        else:
            reason = f"the worker of device {self.devices[device]} died ({first_line(error)})"
        self._rank_ended(device, False, reason)
        if not unreachable:
            self._replace(device)

    # -- actors ---------------------------------------------------------------------------------------------------
    def _spawn(self, device: int) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        node = self._node_of[device]
        resources = bundle(node)
        handle = self._actor_class.options(
            num_cpus=resources["CPU"],
            num_gpus=resources.get("GPU", 0),
            max_restarts=0,
            max_concurrency=1,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self._groups[node.name], placement_group_bundle_index=self._bundle_of[device]
            ),
        ).remote({**self._config, "gpu_threads": max(1, int(resources["CPU"]))}, self.devices[device].to_json())
        starting = handle.ready.remote()
        self._actors[device] = _Actor(handle, starting)
        self._killed.pop(device, None)
        self._calls[starting] = ("ready", device)

    def _replace(self, device: int) -> None:
        """A fresh actor in the place of the one of ``device`` (unless its node is gone)."""
        self._kill(device)
        if device not in self._lost:
            self._spawn(device)

    def _kill(self, device: int) -> None:
        self._killed[device] = True
        with contextlib.suppress(Exception):
            self._ray.kill(self._actors[device].handle, no_restart=True)

    def _portable(self, recipe: dict) -> dict:
        key = repr(sorted(recipe.items()))
        if key not in self._recipes:
            self._recipes[key] = portable(recipe)
        return self._recipes[key]
