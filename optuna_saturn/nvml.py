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
from collections.abc import Iterator
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


def _handle(pynvml: Any, entry: str) -> Any:
    """The NVML handle of a ``CUDA_VISIBLE_DEVICES`` entry: an index, a ``GPU-`` or a ``MIG-`` UUID."""
    if entry.isdigit():
        return pynvml.nvmlDeviceGetHandleByIndex(int(entry))
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


def gpus_in_mig_mode() -> list[int]:
    """Indices of the GPUs whose MIG mode is on (their memory and compute are split into instances)."""
    with _session() as pynvml:
        if pynvml is None:
            return []
        found = []
        try:
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                with contextlib.suppress(Exception):  # (a GPU without MIG support raises NotSupported)
                    if pynvml.nvmlDeviceGetMigMode(handle)[0] == pynvml.NVML_DEVICE_MIG_ENABLE:
                        found.append(index)
        except Exception:
            return found
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
