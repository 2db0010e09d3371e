"""What NVML says about this machine's GPUs, without touching CUDA.

The executor and the pool host must never initialise CUDA (a process that has cannot fork workers that use it,
and holds a context on a GPU for the whole sweep), yet they need to know the GPUs: their model and memory (the
profiles' hardware key), whether they are partitioned into MIG instances, and how much memory is in use (a
killed worker's comes back some time after it is gone). NVML (``nvidia-ml-py``) answers all of these from the
driver directly. Every function returns None (or nothing) where NVML cannot tell: no driver, no library, a MIG
instance where a whole GPU is asked about.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any


@contextlib.contextmanager
def _session() -> Iterator[Any]:
    """pynvml, initialised for the duration (None where it cannot be)."""
    try:
        import pynvml
    except ImportError:
        yield None
        return
    try:
        pynvml.nvmlInit()
    except Exception:  # pynvml.NVMLError: no driver, no library
        yield None
        return
    try:
        yield pynvml
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def visible_gpu_count() -> int:
    """How many GPUs this process sees (NVML's count, cut to ``CUDA_VISIBLE_DEVICES``' entries where it is set),
    without loading CUDA or torch: 0 where NVML cannot tell (no driver, no GPU)."""
    import os

    with _session() as pynvml:
        count = 0 if pynvml is None else int(pynvml.nvmlDeviceGetCount())
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is None or not count:
        return count
    return min(count, len([e for e in mask.split(",") if e.strip()]))


#: How CUDA numbers the GPUs in every process the pool starts (set in their environment by
#: :func:`optuna_saturn.pools.launch_commands.worker_environment`): by PCI bus id, the order NVML is read in here.
#: CUDA's default, FASTEST_FIRST, puts a faster model first on a node of mixed GPUs, where NVML's index does not.
CUDA_DEVICE_ORDER = "PCI_BUS_ID"


def _pci_bus_order(pynvml: Any) -> list[Any]:
    """The handles of the GPUs NVML lists, in CUDA's ``PCI_BUS_ID`` order (domain, bus, device). NVML's own index
    may follow another order, and under SLURM's cgroups CUDA numbers the GPUs it is allowed from 0: an index entry
    is a position in this list, never NVML's index."""
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    def bus_id(handle: Any) -> tuple[int, int, int]:
        pci = pynvml.nvmlDeviceGetPciInfo(handle)
        return int(pci.domain), int(pci.bus), int(pci.device)

    return sorted(handles, key=bus_id)


def _handle(pynvml: Any, entry: str) -> Any:
    """The NVML handle of a ``CUDA_VISIBLE_DEVICES`` entry as CUDA reads it: an index (in PCI bus order), a
    ``GPU-`` or a ``MIG-`` UUID."""
    if entry.isdigit():
        return _pci_bus_order(pynvml)[int(entry)]
    return pynvml.nvmlDeviceGetHandleByUUID(entry)


def gpu_model(entry: str) -> tuple[str, int] | None:
    """The GPU's (or MIG instance's) name and total memory in bytes."""
    with _session() as pynvml:
        if pynvml is None:
            return None
        try:
            handle = _handle(pynvml, entry)
            name = pynvml.nvmlDeviceGetName(handle)
            total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            return (name.decode() if isinstance(name, bytes) else name), total
        except Exception:
            return None


def used_memory(entry: str) -> float | None:
    """Bytes in use on the GPU (or MIG instance), by every process: it counts what a dead process still holds."""
    with _session() as pynvml:
        if pynvml is None:
            return None
        try:
            return float(pynvml.nvmlDeviceGetMemoryInfo(_handle(pynvml, entry)).used)
        except Exception:
            return None


@dataclass(frozen=True)
class HeldMemory:
    """A GPU's memory, and what processes other than the sweep's own hold of it (``others``, bytes; ``pids``:
    theirs, empty where NVML could not say who holds it: then all of its used memory counts as theirs)."""

    total: int
    others: int
    pids: tuple[int, ...] = ()


def held_memory(entry: str, own: Collection[int]) -> HeldMemory | None:
    """How much of the GPU's memory processes outside ``own`` (the sweep's pids) hold now. Where NVML lists no
    processes (no permission, a driver that does not say) or not their memory, every byte in use counts: the
    planner had better plan a context short than run out of memory because of someone else."""
    with _session() as pynvml:
        if pynvml is None:
            return None
        try:
            handle = _handle(pynvml, entry)
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        except Exception:
            return None
        total, used = int(info.total), int(info.used)
        try:
            listed = [
                *pynvml.nvmlDeviceGetComputeRunningProcesses(handle),
                *pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle),
            ]
        except Exception:
            return HeldMemory(total, used)
    others = {int(p.pid): p.usedGpuMemory for p in listed if int(p.pid) not in own}
    if any(held is None for held in others.values()):  # (NVML_VALUE_NOT_AVAILABLE)
        return HeldMemory(total, used, tuple(sorted(others)))
    return HeldMemory(total, sum(int(held) for held in others.values()), tuple(sorted(others)))


def in_mig_mode(entries: list[str]) -> list[str]:
    """The entries (of ``CUDA_VISIBLE_DEVICES``, as CUDA reads them) that name a whole GPU whose MIG mode is on:
    its memory and compute are split into instances. GPUs the entries do not name are none of the sweep's
    business, partitioned or not."""
    with _session() as pynvml:
        if pynvml is None:
            return []
        found = []
        for entry in entries:
            with contextlib.suppress(Exception):  # (a GPU without MIG support raises NotSupported)
                if pynvml.nvmlDeviceGetMigMode(_handle(pynvml, entry))[0] == pynvml.NVML_DEVICE_MIG_ENABLE:
                    found.append(entry)
        return found


def exclusive_gpus() -> list[int]:
    """Indices of the GPUs in an exclusive compute mode (one process may hold a context on them)."""
    with _session() as pynvml:
        if pynvml is None:
            return []
        try:
            return [
                i
                for i in range(pynvml.nvmlDeviceGetCount())
                if pynvml.nvmlDeviceGetComputeMode(pynvml.nvmlDeviceGetHandleByIndex(i))
                in (pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD)
            ]
        except Exception:
            return []


def local_cores(entry: str) -> list[int]:
    """The CPU cores nearest the GPU (its NUMA node's), or [] where NVML cannot tell."""
    import os

    with _session() as pynvml:
        if pynvml is None:
            return []
        try:
            words = pynvml.nvmlDeviceGetCpuAffinity(_handle(pynvml, entry), ((os.cpu_count() or 1) + 63) // 64)
        except Exception:
            return []
        return [64 * i + bit for i, word in enumerate(words) for bit in range(64) if int(word) >> bit & 1]


def uuid_of(entry: str) -> str | None:
    """The UUID (``GPU-...`` or ``MIG-...``) of a ``CUDA_VISIBLE_DEVICES`` entry: the one name of a GPU that every
    process on the machine agrees on, whatever its mask."""
    if entry.startswith(("GPU-", "MIG-")):
        return entry
    with _session() as pynvml:
        if pynvml is None:
            return None
        try:
            uuid = pynvml.nvmlDeviceGetUUID(_handle(pynvml, entry))
            return uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        except Exception:
            return None
