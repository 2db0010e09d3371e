"""A Ray cluster as the sweep sees it: its alive nodes and their devices, found by the same rules as the local
runner's (GPUs where a node has them, otherwise CPU devices from its CPUs), and the address the nodes reach the
executor at. Ray is imported only here and in :mod:`optuna_saturn.pools.ray`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optuna_saturn.devices import Device, DeviceSpec
from optuna_saturn.pools.node_devices import kind_and_count

_INSTALL_HINT = (
    "runner='ray' needs Ray: pip install 'ray[default]' (the ray extra: pip install '.[ray]' from optuna-saturn's "
    "clone)."
)


@dataclass(frozen=True)
class RayNode:
    """One alive node: its Ray id and IP, and what its devices are (measured on the node itself)."""

    name: str
    node_id: str
    ip: str
    devices: tuple[Device, ...]
    hardware: str  # the profile store's hardware fingerprint of one of its devices
    device_memory: int  # bytes one of its devices may use
    cpus_per_device: float

    def to_json(self) -> dict:
        return {"name": self.name, "node_id": self.node_id, "ip": self.ip}


@dataclass(frozen=True)
class RayCluster:
    """The nodes a sweep runs on, in a fixed order, and the driver's IP (where the trials' channel listens)."""

    nodes: tuple[RayNode, ...]
    driver_ip: str
    spec: DeviceSpec = "auto"  # how each node's devices were read (a node that joins is read the same way)

    @property
    def devices(self) -> list[Device]:
        return [d for node in self.nodes for d in node.devices]

    def node(self, name: str) -> RayNode:
        return next(n for n in self.nodes if n.name == name)

    @property
    def largest_node(self) -> int:
        return max(len(n.devices) for n in self.nodes)


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    return ray


def connect(address: str | None = None) -> Any:
    """Ray, connected: to ``address``, or to the cluster this process is already connected to (``ray.init``),
    or to the one ``RAY_ADDRESS`` names; never a new local cluster started behind the user's back."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    if address and address != "auto" and not address.startswith("ray://"):
        _check_reachable(address)  # (Ray itself retries an unreachable address for minutes)
    try:
        ray.init(address=address or "auto", log_to_driver=False, configure_logging=False)
    except ConnectionError as exc:
        raise ConnectionError(
            f"runner='ray' found no Ray cluster at {address or 'auto'!r}: start one (ray start --head on the head "
            "node, ray start --address=HEAD:6379 on the others) and pass ray_address='HEAD:6379', or call "
            "ray.init(address=...) before optimize."
        ) from exc
    return ray


def _check_reachable(address: str) -> None:
    import socket

    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or address, int(port) if port.isdigit() else 6379), timeout=5):
            return
    except OSError as exc:
        raise ConnectionError(
            f"runner='ray' cannot reach a Ray cluster at {address!r} ({exc}). Is `ray start --head` running there, "
            "and is its port (6379 by default) open to this machine?"
        ) from exc


def discover(spec: DeviceSpec = "auto", *, address: str | None = None) -> RayCluster:
    """The cluster's alive nodes and their devices. ``spec`` is read per node: ``"auto"``: every GPU, else one
    CPU device per CPU; ``"cpu"``: one CPU device per CPU; ``"cpu:N"`` or ``N``: N devices on every node."""
    ray = connect(address)
    alive = usable_nodes(ray.nodes())
    if not alive:
        raise RuntimeError("The Ray cluster has no alive node with a CPU or a GPU to run trials on.")
    measured = ray.get([probe(n) for n in alive], timeout=120)
    ips = [n["NodeManagerAddress"] for n in alive]
    nodes = tuple(node_from(info, hardware, spec, ips) for info, hardware in zip(alive, measured))
    return RayCluster(nodes, driver_ip=ray.util.get_node_ip_address(), spec=spec)


def usable_nodes(nodes: list[dict]) -> list[dict]:
    """``ray.nodes()``'s alive nodes with a CPU or a GPU, in a fixed order."""
    alive = sorted((n for n in nodes if n.get("Alive")), key=lambda n: (n["NodeManagerAddress"], n["NodeID"]))
    return [n for n in alive if n["Resources"].get("CPU", 0) >= 1 or n["Resources"].get("GPU", 0) >= 1]


def probe(info: dict) -> Any:
    """A Ray task that measures the node ``info`` describes, on it (a reference to its result)."""
    ray = import_ray()
    return ray.remote(_probe).options(num_cpus=0, label_selector={"ray.io/node-id": info["NodeID"]}).remote()


def node_from(info: dict, hardware: dict, spec: DeviceSpec, ips: list[str]) -> RayNode:
    """The node ``info`` (from ``ray.nodes()``) with its devices, named by its IP (and its id where ``ips``, every
    node's, holds that IP more than once)."""
    ip = info["NodeManagerAddress"]
    return _node(ip if ips.count(ip) == 1 else f"{ip}#{info['NodeID'][:6]}", info, hardware, spec)


def _node(name: str, info: dict, hardware: dict, spec: DeviceSpec) -> RayNode:
    resources = info["Resources"]
    cpus, gpus = int(resources.get("CPU", 0)), int(resources.get("GPU", 0))
    kind, count = _kind_and_count(spec, cpus, gpus, name)
    if kind == "cuda":
        devices = tuple(Device("cuda", i, node=name) for i in range(count))
        per_device = cpus / count
        memory = int(hardware.get("gpu_memory", 2**62))  # unknown: out-of-memory is then found by profiling
        fingerprint = hardware.get("gpu", f"cuda:{resources_accelerator(resources)}")
    else:
        size = cpus // count
        devices = tuple(Device("cpu", i, tuple(range(i * size, (i + 1) * size)), node=name) for i in range(count))
        per_device = float(size)
        memory = int(resources.get("memory", hardware["memory"])) // count
        fingerprint = f"cpu:{hardware['cpu']}:{size}cores"
    return RayNode(name, info["NodeID"], info["NodeManagerAddress"], devices, fingerprint, memory, per_device)


def resources_accelerator(resources: dict) -> str:
    """The GPU model Ray saw on a node (its ``accelerator_type:...`` resource), where nvidia-smi was missing."""
    return next((k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")), "unknown")


def _kind_and_count(spec: DeviceSpec, cpus: int, gpus: int, node: str) -> tuple[str, int]:
    return kind_and_count(spec, cpus, gpus, f"Ray node {node}", runner="runner='ray'")


def _probe() -> dict:
    """What one node's devices are, measured on that node (a Ray task, without a CPU or GPU of its own)."""
    import subprocess

    import psutil

    from optuna_saturn.profiler._hardware import _cpu_model

    out: dict = {"cpu": _cpu_model(), "memory": psutil.virtual_memory().total}
    try:
        query = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        name, mebibytes = query.stdout.splitlines()[0].rsplit(",", 1)
        total = int(float(mebibytes)) * 2**20
        out.update(gpu=f"cuda:{name.strip()}:{total // 2**30}GiB", gpu_memory=total)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        pass
    return out
