"""What the devices are (the profiles' hardware key) and how much memory the planner may give each of them."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence

import optuna

from optuna_saturn.devices import Device
from optuna_saturn.nvml import HeldMemory

_logger = optuna.logging.get_logger("optuna.saturn.profiler")

#: Memory other processes may hold on a GPU before the sweep counts it as shared: its out-of-memory records are
#: then kept for the sweep only (:mod:`optuna_saturn.pricing.sweep_store`), and the planner says why it has less.
#: A CUDA context alone is 300-500 MiB: a notebook that touched the GPU is over it; the driver's own reserve is not.
SHARED_MARGIN = 256 * 2**20


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware_fingerprint(device: Device) -> str:
    """What makes one device faster than another: the GPU model and memory, or the CPU model and core count."""
    if device.kind == "cuda":
        name, total = _gpu_model(device)
        return f"cuda:{name}:{total // 2**30}GiB"
    return f"cpu:{_cpu_model()}:{len(device.cores) or 1}cores"


def device_memory_bytes(devices: Sequence[Device]) -> int:
    """Memory one device of the pool can use: a GPU's, less what other processes hold on it at the sweep's start
    (the least over the pool's GPUs), or a CPU device's share of the machine's RAM."""
    if devices[0].kind == "cuda":
        return min(_free_for_sweep(d, held) for d, held in zip(devices, memory_held_by_others(devices)))
    import psutil

    total: int = psutil.virtual_memory().total  # (psutil has no types here)
    return total // len(devices)


def memory_held_by_others(devices: Sequence[Device]) -> list[HeldMemory | None]:
    """Each device's memory as NVML sees it now, and what processes outside this sweep (this process and every
    process under it: the pool host, its workers) hold of it. None: not a GPU of this machine, or NVML cannot
    tell."""
    from optuna_saturn.devices import physical_gpus
    from optuna_saturn.nvml import held_memory

    local = [d.kind == "cuda" and not d.node for d in devices]
    if not any(local):
        return [None] * len(devices)
    import psutil

    own = {os.getpid(), *(child.pid for child in psutil.Process().children(recursive=True))}
    return [held_memory(physical_gpus([d])[0], own) if here else None for d, here in zip(devices, local)]


def shared_gpus(devices: Sequence[Device]) -> list[str]:
    """The GPUs of ``devices`` on which other processes hold more than :data:`SHARED_MARGIN` now, each with who
    and how much (for a log line)."""
    return [
        f"{device}: {held.others / 2**30:.1f} GiB of {held.total / 2**30:.1f} GiB{_by_whom(held)}"
        for device, held in zip(devices, memory_held_by_others(devices))
        if held is not None and held.others > SHARED_MARGIN
    ]


def _by_whom(held: HeldMemory) -> str:
    return f" (pid {', '.join(map(str, held.pids))})" if held.pids else ""


def _free_for_sweep(device: Device, held: HeldMemory | None) -> int:
    """What the planner gives the GPU: its memory less what other processes hold on it (said where that is more
    than the margin); its whole memory where NVML cannot tell."""
    if held is None:
        return _gpu_model(device)[1]
    if held.others > SHARED_MARGIN:
        _logger.warning(
            f"Other processes hold {held.others / 2**30:.1f} GiB of {device}'s {held.total / 2**30:.1f} GiB"
            f"{_by_whom(held)}: the sweep plans on the {(held.total - held.others) / 2**30:.1f} GiB left, and an "
            "out-of-memory there is kept for this sweep only (not in the profile store)."
        )
    return held.total - held.others


def _gpu_model(device: Device) -> tuple[str, int]:
    """The GPU's name and memory, from NVML (the executor must not initialise CUDA: see
    :mod:`optuna_saturn.nvml`); from CUDA where NVML cannot tell."""
    from optuna_saturn.devices import physical_gpus
    from optuna_saturn.nvml import gpu_model

    model = gpu_model(physical_gpus([device])[0])
    if model is not None:
        return model
    import torch

    props = torch.cuda.get_device_properties(device.index)
    return props.name, int(props.total_memory)
