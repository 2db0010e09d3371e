"""The Ray runner's device pool: a warm worker per device of a Ray cluster, as a Ray actor.

It offers what :class:`~optuna_saturn.pools.warm.WorkerPool` offers the sweep (``start``, ``ready``, ``submit``,
``wait``, ``stop``, ``lost``, ``host_problem``, ``close``), with Ray in the part of the pool host:

- **Placement.** Each node's devices are one placement group, a bundle per device, held for the sweep and
  pinned to that node (``STRICT_PACK`` with a ``ray.io/node-id`` label selector). Device ``i``'s actor runs in
  its bundle, so it holds that device's CPUs (and GPU) and nothing else runs there meanwhile.
- **Jobs** are actor calls: a job on ``k`` devices is one ``run`` call on each of their ``k`` actors, which form a
  fresh process group for it. Its ranks are always on one node, so the rendezvous is a file in a folder of that
  node, and gloo (and NCCL) talk over the node's loopback: nothing a trial starts listens on the network.
- **The trial's channel** to the executor crosses machines: TCP to the executor's IP, authenticated by the
  trial's token (:mod:`optuna_saturn.channel`).
- **Logs and error files** come back with the call's result, into the executor's log folder, so ``saturn:log``
  and the failed-rank report work without a shared filesystem. The objective travels inside its recipe
  (:func:`optuna_saturn.worker.objective_recipe.portable`).
- **Nodes that join** are measured on arrival; their devices join the pool (:meth:`RayPool.joined`) and the
  sweep plans on them from its next plan.
- **Failures.** An actor that dies (its job failed and it must be replaced, ``stop``, a crash) is replaced in
  its bundle. A node that dies loses its devices (:meth:`RayPool.lost`): its jobs end unclean with the reason,
  and the sweep plans on the nodes left.
"""

from __future__ import annotations

import collections
import itertools
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from optuna_saturn.worker.objective_recipe import portable
from optuna_saturn.devices import Device
from optuna_saturn.pools.protocol import JobEnd, JobRanks
from optuna_saturn.pools.ray_actor import DeviceActor, remove_sweep_folder
from optuna_saturn.pools.warm import RENDEZVOUS_TIMEOUT_SECONDS
from optuna_saturn.pools.ray_cluster import RayCluster, RayNode, import_ray, node_from, probe, usable_nodes

_logger = optuna.logging.get_logger("optuna.saturn.runner")

#: Failed starts in a row after which a device's actor is not started again.
START_ATTEMPTS = 3
#: Seconds a node's placement group may take to be placed before its devices are given up.
RESERVE_SECONDS = 300.0
#: Seconds between two looks at which nodes are alive.
NODE_CHECK_SECONDS = 2.0
#: How long a device whose actor Ray could not reach waits for Ray to say whether its node died (Ray's health
#: check fails a node after several missed checks, 15 s or so by default) before the actor alone is replaced.
NODE_DEATH_SECONDS = 30.0


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


class RayPool:
    """Warm workers on ``cluster``'s devices; see the module's docstring. Used from the sweep's thread only."""

    def __init__(
        self,
        cluster: RayCluster,
        *,
        log_dir: Path,
        grace_period: float = 5.0,
        memory_limit: float | None = None,
        multi_device: bool = True,
        engines: Sequence[str] = (),
    ) -> None:
        self.cluster = cluster
        self.devices: list[Device] = cluster.devices
        self._node_of = [n for n in cluster.nodes for _ in n.devices]
        self._bundle_of = [b for n in cluster.nodes for b in range(len(n.devices))]
        self._log_dir = log_dir
        self._grace = grace_period
        self._config = {"memory_limit": memory_limit, "multi_device": multi_device, "engines": sorted(engines),
                        "sweep": secrets.token_hex(8), "extensions": os.environ.get("TORCH_EXTENSIONS_DIR")}
        self._ray: Any = None
        self._actor_class: Any = None
        self._groups: dict[str, Any] = {}  # node name -> its placement group
        self._actors: dict[int, _Actor] = {}
        self._calls: dict[Any, tuple[str, int]] = {}  # pending reference -> ("ready" | "run", device)
        self._jobs: dict[Any, _RayJob] = {}
        self._ended: collections.deque[JobEnd] = collections.deque()
        self._lost: dict[int, str] = {}  # device -> why it is gone
        self._killed: dict[int, bool] = {}  # devices whose actor this pool killed (its death is no news)
        self._suspect: dict[int, float] = {}  # devices whose actor Ray could not reach, since when
        self._start_failures: dict[int, int] = {}  # device -> failed starts in a row
        self._probes: dict[Any, dict] = {}
        self._ignored: set[str] = set()  # nodes that joined but cannot be used
        self._reserved_at: dict[str, float] = {}  # node name -> when its placement group was asked for  # a node that joined: the reference of its measurement -> its info
        self._joined: list[Device] = []  # devices of nodes that joined, not yet told to the sweep
        self._recipes: dict[str, dict] = {}
        self._rendezvous_ids = itertools.count()
        self._nodes_checked = 0.0

    # -- life cycle ----------------------------------------------------------------------------------------------
    def start(self, preload: dict | None = None) -> None:
        """Reserve every node's devices and start their actors; each imports ``preload`` (an objective recipe)."""
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
            [_bundle(node)] * len(node.devices), strategy="STRICT_PACK", name=f"optuna-saturn-{node.name}",
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
        removals = [cleanup.options(num_cpus=0, label_selector={"ray.io/node-id": n.node_id}).remote(
            self._config["sweep"]) for n in self.cluster.nodes if n.node_id in alive]
        try:
            self._ray.get(removals, timeout=30)
        except Exception:  # noqa: BLE001 (a node that went away meanwhile keeps its temporary folder)
            pass
        for group in self._groups.values():
            try:
                remove_placement_group(group)
            except Exception:  # noqa: BLE001 (its node may be gone; Ray frees it then)
                pass
        self._actors.clear()
        self._calls.clear()

    # -- jobs -----------------------------------------------------------------------------------------------------
    def ready(self) -> set[int]:
        """Devices whose actor is up and idle."""
        return {i for i, a in self._actors.items()
                if a.starting is None and a.job is None and i not in self._lost and i not in self._suspect}

    def joined(self) -> list[Device]:
        """Devices of nodes that joined the cluster since the last call, in the pool's order (they follow the
        devices the pool had); their actors are starting."""
        joined, self._joined = self._joined, []
        return joined

    def lost(self) -> set[int]:
        """Devices of nodes that died: no job runs on them again in this sweep."""
        return set(self._lost)

    def host_problem(self) -> str | None:
        if len(self._lost) == len(self.devices):
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
            call = actor.handle.run.remote({
                **job, "name": str(key), "rank": rank, "world_size": len(devices), "rendezvous": rendezvous,
                "timeout": RENDEZVOUS_TIMEOUT_SECONDS, "worker": str(self.devices[device]),
            })
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
            actor.starting = None
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
            self._lost[device] = f"its worker failed to start {failures} times ({_first_line(error)})"
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

    def _check_nodes(self) -> None:
        """Which nodes died since the last look: their devices are lost and their jobs end unclean now (Ray may
        take much longer to fail the calls)."""
        if time.monotonic() - self._nodes_checked < NODE_CHECK_SECONDS:
            return
        self._nodes_checked = time.monotonic()
        try:
            nodes = self._ray.nodes()
        except Exception:  # noqa: BLE001 (the GCS is briefly unreachable: look again next time)
            return
        alive = {n["NodeID"] for n in nodes if n.get("Alive")}
        for node in self.cluster.nodes:
            if node.node_id not in alive:
                self._lose_node(node, f"Ray node {node.name} died")
            elif node.name in self._reserved_at and self._groups[node.name].wait(0):
                del self._reserved_at[node.name]
            elif node.name in self._reserved_at and time.monotonic() - self._reserved_at[node.name] > RESERVE_SECONDS:
                del self._reserved_at[node.name]
                self._lose_node(node, f"Ray node {node.name}'s devices could not be reserved in "
                                      f"{RESERVE_SECONDS:.0f} s ({_bundle(node)} each: other work holds them?)")
        known = ({n.node_id for n in self.cluster.nodes} | {info["NodeID"] for info in self._probes.values()}
                 | self._ignored)
        for info in usable_nodes(nodes):
            if info["NodeID"] not in known:
                self._probes[probe(info)] = info
        for device, since in list(self._suspect.items()):
            if device in self._lost:
                del self._suspect[device]
            elif time.monotonic() - since > NODE_DEATH_SECONDS:  # its node lives: the actor alone was lost
                del self._suspect[device]
                self._replace(device)

    def _welcome(self, info: dict, measured: Any) -> None:
        """A node joined: its devices join the pool, and their actors start."""
        try:
            hardware = self._ray.get(measured)
        except self._ray.exceptions.RayError as exc:
            _logger.warning(f"A Ray node that joined ({info['NodeManagerAddress']}) could not be measured: {exc}")
            self._ignored.add(info["NodeID"])
            return
        ips = [n.ip for n in self.cluster.nodes] + [info["NodeManagerAddress"]]
        try:
            node = node_from(info, hardware, self.cluster.spec, ips)
        except ValueError as exc:  # it does not have what devices= asks of every node
            _logger.warning(f"A Ray node that joined is not used: {exc}")
            self._ignored.add(info["NodeID"])
            return
        if node.hardware != self.cluster.nodes[0].hardware:
            _logger.warning(f"Ray node {node.name} ({node.hardware}) differs from the others "
                            f"({self.cluster.nodes[0].hardware}); its trials are planned as if it did not.")
        self.cluster = RayCluster((*self.cluster.nodes, node), self.cluster.driver_ip, self.cluster.spec)
        first = len(self.devices)
        self.devices.extend(node.devices)
        self._node_of.extend([node] * len(node.devices))
        self._bundle_of.extend(range(len(node.devices)))
        self._reserve(node)
        for index in range(first, len(self.devices)):
            self._spawn(index)
        self._joined.extend(node.devices)
        _logger.info(f"Ray node {node.name} joined with {len(node.devices)} device(s); the sweep plans on them.")

    def _alive_nodes(self) -> set[str] | None:
        try:
            return {n["NodeID"] for n in self._ray.nodes() if n.get("Alive")}
        except Exception:  # noqa: BLE001 (the GCS is briefly unreachable: look again next time)
            return None

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
        unreachable = not killed and (isinstance(error, self._ray.exceptions.ActorUnavailableError)
                                      or "node" in str(error).lower())
        if unreachable:
            reason = (f"the worker of device {self.devices[device]} became unreachable: Ray node {node.name} died "
                      f"or left the cluster ({_first_line(error)})")
            self._suspect[device] = time.monotonic()
        else:
            reason = f"the worker of device {self.devices[device]} died ({_first_line(error)})"
        self._rank_ended(device, False, reason)
        if not unreachable:
            self._replace(device)

    def _lose_node(self, node: RayNode, reason: str) -> None:
        """``node`` is gone: so are its devices; the jobs that ran there end unclean with ``reason``."""
        devices = [d for d, n in enumerate(self._node_of) if n is node and d not in self._lost]
        for device in devices:
            self._lost[device] = reason
        for call, (_, d) in list(self._calls.items()):
            if d in devices:
                del self._calls[call]
        for device in devices:
            self._actors[device].starting = None
            self._rank_ended(device, False, reason)
        if devices:
            _logger.warning(f"{reason}: its {len(devices)} device(s) are gone; the sweep goes on with the nodes left.")

    # -- actors ---------------------------------------------------------------------------------------------------
    def _spawn(self, device: int) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        node = self._node_of[device]
        bundle = _bundle(node)
        handle = self._actor_class.options(
            num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0), max_restarts=0, max_concurrency=1,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self._groups[node.name], placement_group_bundle_index=self._bundle_of[device]),
        ).remote(self._config, self.devices[device].to_json())
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
        try:
            self._ray.kill(self._actors[device].handle, no_restart=True)
        except Exception:  # noqa: BLE001 (already dead)
            pass

    def _portable(self, recipe: dict) -> dict:
        key = repr(sorted(recipe.items()))
        if key not in self._recipes:
            self._recipes[key] = portable(recipe)
        return self._recipes[key]


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0][:160]}" if lines else type(error).__name__


def _bundle(node: RayNode) -> dict[str, float]:
    """What one device of ``node`` holds in its placement group."""
    bundle = {"CPU": node.cpus_per_device}
    if node.devices[0].kind == "cuda":
        bundle["GPU"] = 1
    return bundle
