"""A Ray cluster's nodes as a pool kind (``runner="ray"``): a warm worker per device as a Ray actor, each trial
inside one node (:mod:`optuna_saturn.pools.ray`)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from optuna_saturn.devices import DeviceSpec
from optuna_saturn.pools.kinds import BackendOptions, Placement
from optuna_saturn.pools.node_rules import elastic_across_nodes, warm_only
from optuna_saturn.pools.ray import RayWorkers
from optuna_saturn.pools.ray_cluster import discover
from optuna_saturn.pools.warm_backend import WarmBackend
from optuna_saturn.strategy import Strategy


class RayPool:
    """Trials run on the alive nodes of a Ray cluster. ``address``: the cluster to connect to (``"HEAD_IP:6379"``);
    None: the one this process is connected to (``ray.init``), or ``RAY_ADDRESS``, or the one started on this
    machine (``ray start``). The devices (``devices=``) are read per node."""

    name = "ray"

    def __init__(self, *, address: str | None = None) -> None:
        if address is not None and (not isinstance(address, str) or not address):
            raise ValueError(f"RayPool(address=...) takes 'HEAD_IP:6379' or None, got {address!r}.")
        self.address = address

    def place(self, devices: DeviceSpec, *, allow_shared_cores: bool) -> Placement:
        cluster = discover(devices, address=self.address)
        node = cluster.nodes[0]  # (the nodes of a cluster are alike)
        return Placement(
            cluster.devices,
            cluster.largest_node,
            hardware=node.hardware,
            device_memory=node.device_memory,
            leases_here=False,  # (each device's actor leases it on its node)
            machine_memory_limit=False,  # (the nodes differ from this machine)
            found=cluster,
        )

    def runnable(self, strategies: list[Strategy], asked: Sequence[str] | None) -> list[Strategy]:
        """Those its warm workers (Ray actors) run: see :func:`~optuna_saturn.pools.node_rules.warm_only`."""
        return warm_only(strategies, asked, "runner='ray'")

    def elastic(self, wanted: bool, *, checkpoint_dir: str | os.PathLike | None, isolate_network: bool) -> bool:
        return elastic_across_nodes(
            wanted, checkpoint_dir=checkpoint_dir, isolate_network=isolate_network, runner="runner='ray'"
        )

    def warm_backend(self, placement: Placement, options: BackendOptions) -> WarmBackend:
        return RayWorkers(placement.found, study=options.study_name, **options.common(placement.largest_trial))

    def __repr__(self) -> str:
        return f"RayPool(address={self.address!r})"
