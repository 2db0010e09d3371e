"""A SLURM allocation's nodes as a pool kind (``runner="slurm"``): the sweep runs inside the allocation (its script
under ``sbatch``, or ``salloc``), and a warm worker host per node, started by ``srun``, runs its trials
(:mod:`optuna_saturn.pools.slurm`), each trial inside one node."""

from __future__ import annotations

import os
from collections.abc import Sequence

from optuna_saturn.devices import DeviceSpec
from optuna_saturn.pools.kinds import BackendOptions, Placement
from optuna_saturn.pools.node_rules import elastic_across_nodes, warm_only
from optuna_saturn.pools.slurm import SlurmWorkers
from optuna_saturn.pools.slurm_allocation import read_allocation
from optuna_saturn.pools.warm_backend import WarmBackend
from optuna_saturn.strategy import Strategy


class SlurmPool:
    """Trials run on the nodes of the SLURM allocation this process runs in (``SLURM_JOB_ID``): outside one, it
    refuses, naming ``sbatch`` and ``salloc`` (asking SLURM for nodes itself is not supported yet). ``devices=`` is
    read per node, from the CPUs and GPUs SLURM gave the job there. ``channel_host``: the address the nodes reach
    this process at (None: the one its packets to them leave from)."""

    name = "slurm"

    def __init__(self, *, channel_host: str | None = None) -> None:
        if channel_host is not None and (not isinstance(channel_host, str) or not channel_host):
            raise ValueError(f"SlurmPool(channel_host=...) takes an IP address or host name, got {channel_host!r}.")
        self.channel_host = channel_host

    def place(self, devices: DeviceSpec, *, allow_shared_cores: bool) -> Placement:
        allocation = read_allocation(devices, channel_host=self.channel_host)
        return Placement(
            allocation.devices,
            allocation.largest_node,
            leases_here=False,  # (each node's host leases its devices there)
            machine_memory_limit=False,  # (the nodes may differ from this machine)
            found=allocation,
        )

    def runnable(self, strategies: list[Strategy], asked: Sequence[str] | None) -> list[Strategy]:
        """Those its warm workers run: see :func:`~optuna_saturn.pools.node_rules.warm_only`."""
        return warm_only(strategies, asked, "runner='slurm'")

    def elastic(self, wanted: bool, *, checkpoint_dir: str | os.PathLike | None, isolate_network: bool) -> bool:
        return elastic_across_nodes(
            wanted, checkpoint_dir=checkpoint_dir, isolate_network=isolate_network, runner="runner='slurm'"
        )

    def warm_backend(self, placement: Placement, options: BackendOptions) -> WarmBackend:
        return SlurmWorkers(placement.found, study=options.study_name, **options.common(placement.largest_trial))

    def __repr__(self) -> str:
        return f"SlurmPool(channel_host={self.channel_host!r})"
