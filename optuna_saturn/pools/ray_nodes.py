"""The Ray pool's nodes: which died (their devices are lost, their jobs end unclean), which joined (measured on
arrival, their devices join the pool), whose devices could not be reserved, and which go back to the cluster. A part of
:class:`~optuna_saturn.pools.ray.RayWorkers`, kept apart so that each file holds one concern: this one the cluster's
membership, that one the actors and their jobs."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import optuna

from optuna_saturn.devices import Device
from optuna_saturn.pools.protocol import whole_nodes
from optuna_saturn.pools.ray_cluster import RayCluster, RayNode, node_from, probe, usable_nodes

_logger = optuna.logging.get_logger("optuna.saturn.runner")

#: Seconds a node's placement group may take to be placed before its devices are given up.
RESERVE_SECONDS = 300.0
#: Seconds between two looks at which nodes are alive.
NODE_CHECK_SECONDS = 2.0
#: How long a device whose actor Ray could not reach waits for Ray to say whether its node died (Ray's health
#: check fails a node after several missed checks, 15 s or so by default) before the actor alone is replaced.
NODE_DEATH_SECONDS = 30.0


class NodeMembership:
    """The membership half of :class:`~optuna_saturn.pools.ray.RayWorkers`, which sets these attributes up and
    starts, replaces and ends the actors (``_reserve``, ``_spawn``, ``_replace``, ``_rank_ended``, ``_kill``)."""

    cluster: RayCluster
    devices: list[Device]
    _ray: Any
    _node_of: list[RayNode]
    _bundle_of: list[int]
    _groups: dict[str, Any]
    _actors: dict[int, Any]
    _calls: dict[Any, tuple[str, int]]
    _lost: dict[int, str]
    _released: set[int]
    _killed: dict[int, bool]
    _suspect: dict[int, float]
    _probes: dict[Any, dict]
    _ignored: set[str]
    _reserved_at: dict[str, float]
    _joined: list[Device]
    _nodes_checked: float
    # RayWorkers's methods, which membership calls
    _reserve: Callable[[RayNode], None]
    _spawn: Callable[[int], None]
    _replace: Callable[[int], None]
    _rank_ended: Callable[[int, bool, str], None]
    _kill: Callable[[int], None]
    ready: Callable[[], set[int]]

    def _check_nodes(self) -> None:
        """Which nodes died since the last look: their devices are lost and their jobs end unclean now (Ray may
        take much longer to fail the calls)."""
        if time.monotonic() - self._nodes_checked < NODE_CHECK_SECONDS:
            return
        self._nodes_checked = time.monotonic()
        try:
            nodes = self._ray.nodes()
        except Exception:
            return
        alive = {n["NodeID"] for n in nodes if n.get("Alive")}
        for node in self.cluster.nodes:
            if node.name not in self._groups:  # (given back: what becomes of it is the cluster's)
                continue
            if node.node_id not in alive:
                self._lose_node(node, f"Ray node {node.name} died")
            elif node.name in self._reserved_at and self._groups[node.name].wait(0):
                del self._reserved_at[node.name]
            elif node.name in self._reserved_at and time.monotonic() - self._reserved_at[node.name] > RESERVE_SECONDS:
                del self._reserved_at[node.name]
                self._lose_node(
                    node,
                    f"Ray node {node.name}'s devices could not be reserved in "
                    f"{RESERVE_SECONDS:.0f} s ({bundle(node)} each: other work holds them?)",
                )
        known = (
            {n.node_id for n in self.cluster.nodes} | {info["NodeID"] for info in self._probes.values()} | self._ignored
        )
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
            _logger.warning(
                f"Ray node {node.name} ({node.hardware}) differs from the others "
                f"({self.cluster.nodes[0].hardware}); its trials are planned as if it did not."
            )
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

    def release(self, devices: set[int]) -> set[int]:
        """Whole nodes whose devices are all idle and offered: their actors stop and their placement group is
        removed, so the cluster (its autoscaler, other sweeps) has them back. A placement group is reserved and
        removed whole, so a node goes only with all its devices."""
        from ray.util.placement_group import remove_placement_group

        nodes = whole_nodes(self.devices, devices & self.ready(), set(self._lost) | self._released)
        for name, members in nodes.items():
            for device in members:
                self._kill(device)
                self._killed.pop(device, None)  # (no call of its is pending: it was idle)
                del self._actors[device]
            with contextlib.suppress(Exception):
                remove_placement_group(self._groups.pop(name))
            self._reserved_at.pop(name, None)
            self._released |= members
            _logger.info(f"Ray node {name}'s {len(members)} device(s) are given back to the cluster.")
        return {d for members in nodes.values() for d in members}

    def _alive_nodes(self) -> set[str] | None:
        try:
            return {n["NodeID"] for n in self._ray.nodes() if n.get("Alive")}
        except Exception:
            return None

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


def first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0][:160]}" if lines else type(error).__name__


def bundle(node: RayNode) -> dict[str, float]:
    """What one device of ``node`` holds in its placement group."""
    bundle = {"CPU": node.cpus_per_device}
    if node.devices[0].kind == "cuda":
        bundle["GPU"] = 1
    return bundle
