"""A SLURM allocation as the sweep sees it: its nodes, each node's devices (read from SLURM's environment, as
``sbatch`` and ``salloc`` set it), each node's address, and the address the nodes reach the executor at.

Why the environment: inside an allocation, SLURM has said which nodes and how many CPUs (and GPUs) on each are the
job's (``SLURM_JOB_NODELIST``, ``SLURM_JOB_CPUS_PER_NODE``, ``SLURM_GPUS_PER_NODE``/``SLURM_GPUS_ON_NODE``); the
pool uses exactly those, and ``scontrol`` only to expand the node list and find each node's address.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from optuna_saturn.devices import Device, DeviceSpec
from optuna_saturn.pools.node_devices import kind_and_count

#: What the errors say to a user whose script runs outside an allocation.
OUTSIDE_AN_ALLOCATION = (
    "SlurmPool() runs inside a SLURM allocation, and this process is not in one (no SLURM_JOB_ID). Run the script "
    "with sbatch (a batch script: see docs/clusters.md), or inside salloc (salloc -N2 --exclusive python "
    "script.py), or let the pool ask SLURM for nodes: SlurmPool(nodes=2, partition=..., time='1:00:00')."
)


@dataclass(frozen=True)
class SlurmNode:
    """One node of the allocation: its name, its address, and its devices."""

    name: str
    address: str
    cpus: int
    gpus: int
    devices: tuple[Device, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "address": self.address}


@dataclass(frozen=True)
class Allocation:
    """The job's nodes, in SLURM's order, and where the executor's channel listens for them."""

    job_id: str
    nodes: tuple[SlurmNode, ...]
    channel_host: str

    @property
    def devices(self) -> list[Device]:
        return [d for node in self.nodes for d in node.devices]

    @property
    def largest_node(self) -> int:
        return max(len(n.devices) for n in self.nodes)

    def node(self, name: str) -> SlurmNode:
        return next(n for n in self.nodes if n.name == name)


def read_allocation(
    spec: DeviceSpec = "auto", *, channel_host: str | None = None, env: Mapping[str, str] = os.environ
) -> Allocation:
    """The allocation this process runs in (see the module's docstring); ``spec`` (``devices=``) is read per node.
    Raises with the fix outside an allocation."""
    job = env.get("SLURM_JOB_ID")
    if not job:
        raise RuntimeError(OUTSIDE_AN_ALLOCATION)
    names = scontrol(["show", "hostnames", env.get("SLURM_JOB_NODELIST", "")]).split()
    if not names:
        raise RuntimeError(f"SLURM job {job} names no nodes (SLURM_JOB_NODELIST={env.get('SLURM_JOB_NODELIST')!r}).")
    cpus = per_node(env.get("SLURM_JOB_CPUS_PER_NODE", ""), len(names), "SLURM_JOB_CPUS_PER_NODE")
    gpus = gpus_per_node(env)
    addresses = node_addresses(names)
    nodes = tuple(_node(name, addresses[name], cpu, gpus, spec) for name, cpu in zip(names, cpus))
    return Allocation(job, nodes, channel_host or executor_address([addresses[n] for n in names]))


def _node(name: str, address: str, cpus: int, gpus: int, spec: DeviceSpec) -> SlurmNode:
    kind, count = kind_and_count(spec, cpus, gpus, f"SLURM node {name}", runner="SlurmPool")
    if kind == "cuda":
        devices = tuple(Device("cuda", i, node=name) for i in range(count))
    else:
        size = cpus // count
        devices = tuple(Device("cpu", i, tuple(range(i * size, (i + 1) * size)), node=name) for i in range(count))
    return SlurmNode(name, address, cpus, gpus, devices)


def per_node(value: str, nodes: int, name: str) -> list[int]:
    """SLURM's compressed per-node counts (``"4,2(x3)"``) as one count per node."""
    counts: list[int] = []
    for part in filter(None, value.split(",")):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise RuntimeError(f"Cannot read {name}={value!r} (SLURM writes it as '4,2(x3)').")
        counts += [int(match[1])] * int(match[2] or 1)
    if len(counts) != nodes:
        raise RuntimeError(f"{name}={value!r} gives {len(counts)} nodes' counts, for {nodes} nodes.")
    return counts


def gpus_per_node(env: Mapping[str, str]) -> int:
    """The GPUs the job has on each node: ``SLURM_GPUS_PER_NODE`` (``"2"`` or ``"a100:2"``), else the node this
    runs on (``SLURM_GPUS_ON_NODE``, as a batch script sees it; the nodes of an allocation are alike), else 0."""
    for name in ("SLURM_GPUS_PER_NODE", "SLURM_GPUS_ON_NODE"):
        value = env.get(name, "").rpartition(":")[2].split("(")[0]
        if value.isdigit():
            return int(value)
    return 0


def node_addresses(names: list[str]) -> dict[str, str]:
    """Each node's address, as SLURM reaches it (``NodeAddr``)."""
    found = {}
    for line in scontrol(["--oneliner", "show", "node", ",".join(names)]).splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "NodeName" in fields:
            found[fields["NodeName"]] = fields.get("NodeAddr", fields["NodeName"])
    missing = [n for n in names if n not in found]
    if missing:
        raise RuntimeError(f"scontrol show node does not know the allocation's nodes {missing}.")
    return found


def executor_address(node_addresses: list[str]) -> str:
    """This machine's address on the way to the nodes (the one its packets to them leave from): where they reach
    the executor's channel. Found without sending anything (a UDP socket's connect only picks the route)."""
    here = {a for a in node_addresses if _is_local(a)}
    target = next((a for a in node_addresses if a not in here), node_addresses[0])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((socket.gethostbyname(target), 9))
        return str(probe.getsockname()[0])


def _is_local(address: str) -> bool:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind((socket.gethostbyname(address), 0))
        return True
    except OSError:
        return False


def scontrol(arguments: list[str], *, cwd: str | None = None) -> str:
    """``scontrol``'s answer (run in ``cwd``: where it writes a file); raises with the fix where SLURM's commands
    are missing or fail."""
    try:
        done = subprocess.run(
            ["scontrol", *arguments], capture_output=True, text=True, timeout=60, check=False, cwd=cwd
        )
    except FileNotFoundError as exc:
        raise RuntimeError("SlurmPool needs SLURM's commands (scontrol, srun) on the PATH.") from exc
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"scontrol {' '.join(arguments)} did not answer in 60 s: is slurmctld up?") from exc
    if done.returncode != 0:
        raise RuntimeError(f"scontrol {' '.join(arguments)} failed: {done.stderr.strip()}")
    return done.stdout
