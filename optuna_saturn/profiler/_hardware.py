from __future__ import annotations

import platform
from collections.abc import Sequence

from optuna_saturn.devices import Device


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
    """Memory one device of the pool can use: the GPU's, or a CPU device's share of the machine's RAM."""
    if devices[0].kind == "cuda":
        return min(_gpu_model(d)[1] for d in devices)
    import psutil

    total: int = psutil.virtual_memory().total  # (psutil has no types here)
    return total // len(devices)


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
