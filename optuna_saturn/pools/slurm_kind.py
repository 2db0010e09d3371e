"""A SLURM cluster's nodes as a pool kind (``runner="slurm"``): inside an allocation (the sweep's script under
``sbatch``, or ``salloc``), the allocation's nodes; outside one, a job the pool asks SLURM for
(:mod:`optuna_saturn.pools.slurm_request`). A warm worker host per node, started by ``srun``, runs its trials
(:mod:`optuna_saturn.pools.slurm`), each trial inside one node."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import optuna

from optuna_saturn.devices import DeviceSpec
from optuna_saturn.pools.kinds import BackendOptions, Placement
from optuna_saturn.pools.node_rules import elastic_across_nodes, warm_only
from optuna_saturn.pools.slurm import SlurmWorkers
from optuna_saturn.pools.slurm_allocation import Allocation, read_allocation
from optuna_saturn.pools.slurm_request import SlurmRequest
from optuna_saturn.pools.warm_backend import WarmBackend
from optuna_saturn.strategy import Strategy

_logger = optuna.logging.get_logger("optuna.saturn")


class SlurmPool:
    """Trials run on SLURM nodes. Inside an allocation (``SLURM_JOB_ID`` is set): its nodes, and the options that
    ask for nodes are not used (a warning says so). Outside one, ``nodes=`` asks SLURM for that many nodes, in one
    job (``partition``, ``time`` as ``salloc --time`` takes it, ``gpus_per_node``, ``cpus_per_node``: None for
    whole nodes, ``salloc_options``: any other ``salloc`` option, such as ``["--account=lab"]``; None: SLURM's
    defaults), waited for with progress lines, given back node by node under a deadline or a budget, and ended
    when the sweep ends (``start_timeout``: seconds to wait for it to start, None for as long as SLURM takes).
    ``devices=`` is read per node, from the CPUs and GPUs SLURM gave the job there. ``channel_host``: the address
    the nodes reach this process at (None: the one its packets to them leave from)."""

    name = "slurm"

    def __init__(
        self,
        *,
        nodes: int | None = None,
        partition: str | None = None,
        time: str | None = None,
        gpus_per_node: int | None = None,
        cpus_per_node: int | None = None,
        salloc_options: Sequence[str] = (),
        start_timeout: float | None = None,
        channel_host: str | None = None,
    ) -> None:
        if channel_host is not None and (not isinstance(channel_host, str) or not channel_host):
            raise ValueError(f"SlurmPool(channel_host=...) takes an IP address or host name, got {channel_host!r}.")
        for option, value in (("nodes", nodes), ("gpus_per_node", gpus_per_node), ("cpus_per_node", cpus_per_node)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"SlurmPool({option}=...) takes a whole number of at least 1, got {value!r}.")
        if isinstance(salloc_options, str):
            raise ValueError(f"SlurmPool(salloc_options=...) takes a list of options, got {salloc_options!r}.")
        asking = {"partition": partition, "time": time, "gpus_per_node": gpus_per_node, "cpus_per_node": cpus_per_node}
        if nodes is None and (any(v is not None for v in asking.values()) or salloc_options):
            raise ValueError("SlurmPool's partition=, time=, gpus_per_node=... ask SLURM for nodes: pass nodes= too.")
        self.channel_host = channel_host
        self.nodes = nodes
        self._request = (
            None
            if nodes is None
            else SlurmRequest(
                nodes=nodes,
                partition=partition,
                time_limit=time,
                gpus_per_node=gpus_per_node,
                cpus_per_node=cpus_per_node,
                salloc_options=salloc_options,
                start_timeout=start_timeout,
            )
        )

    def place(self, devices: DeviceSpec, *, allow_shared_cores: bool) -> Placement:
        allocation = self._allocation(devices)
        return Placement(
            allocation.devices,
            allocation.largest_node,
            leases_here=False,  # (each node's host leases its devices there)
            machine_memory_limit=False,  # (the nodes may differ from this machine)
            found=allocation,
        )

    def _allocation(self, devices: DeviceSpec) -> Allocation:
        """The allocation this process runs in, or else the job the pool asks SLURM for."""
        inside = os.environ.get("SLURM_JOB_ID")
        if inside or self._request is None:
            if inside and self._request is not None:
                _logger.warning(
                    f"This process runs inside SLURM job {inside}: the SLURM pool runs on its nodes, and does not "
                    f"ask for {self.nodes} node(s) of its own (SlurmPool(nodes=...) is for a script run outside one)."
                )
                self._request = None
            return read_allocation(devices, channel_host=self.channel_host)
        # (a second executor of this pool runs on the job the first one asked for, while it runs)
        env = dict(self._request.env) if self._request.running() else self._request.start()
        try:
            return read_allocation(devices, channel_host=self.channel_host, env=env)
        except BaseException:
            self._request.end()
            raise

    def runnable(self, strategies: list[Strategy], asked: Sequence[str] | None) -> list[Strategy]:
        """Those its warm workers run: see :func:`~optuna_saturn.pools.node_rules.warm_only`."""
        return warm_only(strategies, asked, "runner='slurm'")

    def elastic(self, wanted: bool, *, checkpoint_dir: str | os.PathLike | None, isolate_network: bool) -> bool:
        return elastic_across_nodes(
            wanted, checkpoint_dir=checkpoint_dir, isolate_network=isolate_network, runner="runner='slurm'"
        )

    def warm_backend(self, placement: Placement, options: BackendOptions) -> WarmBackend:
        """The workers on the placement's nodes. A job the pool asked for ends with them; a later sweep asks SLURM
        again for the same nodes (the devices the sweep plans on are theirs)."""
        allocation, request = placement.found, self._request
        if request is not None and not request.running():
            env = request.start(nodelist=[node.name for node in allocation.nodes])
            allocation = dataclasses.replace(allocation, job_id=env["SLURM_JOB_ID"])
        return SlurmWorkers(
            allocation,
            study=options.study_name,
            on_close=None if request is None else request.end,
            **options.common(placement.largest_trial),
        )

    def close(self) -> None:
        """End the job the pool asked for, if it runs: the executor calls it when its construction fails after
        :meth:`place` (the job would be held, idle, until the process ends)."""
        if self._request is not None:
            self._request.end()

    def __repr__(self) -> str:
        asked = "" if self.nodes is None else f"nodes={self.nodes}, "
        return f"SlurmPool({asked}channel_host={self.channel_host!r})"
