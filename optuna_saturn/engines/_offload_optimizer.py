"""Under ZeRO-Offload on GPUs, the optimizer step runs on the host while the GPU waits: it steps DeepSpeed's
``DeepSpeedCPUAdam`` (vectorised C++) instead of the user's ``torch.optim.Adam``/``AdamW``.

Measured here on one core (``benchmarks/offload_optimizer.py``, two runs): a step over 50 M parameters took
500-715 ms with torch's AdamW and 70-80 ms with ``DeepSpeedCPUAdam``; 40 steps of a small MLP under a warm-up
schedule gave the same losses within 6e-7 relative (AdamW with weight decay, Adam, Adam with L2 decay), where the
strategy-invariance tests allow 1e-4. So the trial's values stay those of the user's optimizer, and an offload
option is priced at its real speed.

The swap keeps the user's parameter groups (the same dicts: a learning-rate scheduler made on the user's optimizer,
before or after ``prepare``, still sets the rate that is used) and their hyperparameters. It is made only where the
result is the same update: Adam or AdamW (exactly those classes, not subclasses that may change the step), without
``amsgrad``, ``maximize``, ``capturable`` or ``differentiable`` (DeepSpeedCPUAdam has none of them), with no state yet
(a restored optimizer keeps its moments), on a GPU (on CPU devices there is nothing to offload to), and only where
the ``cpu_adam`` op is already built (the pool builds it before its first job, see
:mod:`optuna_saturn.pools.deepspeed_ops`): a trial never compiles it. Anywhere else the user's optimizer steps, as
before.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

#: The op's name: its folder and library in the extensions folder (``TORCH_EXTENSIONS_DIR``).
CPU_ADAM_OP = "cpu_adam"
_SWAPPED = (torch.optim.Adam, torch.optim.AdamW)
_UNSUPPORTED_FLAGS = ("amsgrad", "maximize", "capturable", "differentiable")


def offloads_optimizer(zero: Mapping[str, Any]) -> bool:
    """The ZeRO section moves the optimizer's step to the host (``offload_optimizer`` on the CPU or NVMe)."""
    offload = zero.get("offload_optimizer") or {}
    return str(offload.get("device", "none")) in ("cpu", "nvme")


def why_not_swapped(optimizer: torch.optim.Optimizer, zero: dict, device: torch.device) -> str | None:
    """Why the user's optimizer steps as it is (None: DeepSpeedCPUAdam steps for it)."""
    if not offloads_optimizer(zero):
        return "the optimizer is not offloaded"
    if device.type != "cuda":
        return "the device is not a GPU"
    if type(optimizer) not in _SWAPPED:
        return f"{type(optimizer).__name__} is not Adam or AdamW"
    flags = [f for f in _UNSUPPORTED_FLAGS if any(group.get(f) for group in optimizer.param_groups)]
    if flags:
        return f"it uses {', '.join(flags)}"
    if len({bool(group.get("decoupled_weight_decay")) for group in optimizer.param_groups}) > 1:
        return "its groups decay weights in both ways"  # (DeepSpeedCPUAdam's adamw_mode is one for all groups)
    if optimizer.state:
        return "it has state already"
    if not cpu_adam_is_built():
        return f"DeepSpeed's {CPU_ADAM_OP} op is not built"
    return None


def host_optimizer(optimizer: torch.optim.Optimizer, zero: dict, device: torch.device) -> torch.optim.Optimizer:
    """The optimizer ZeRO-Offload steps: ``DeepSpeedCPUAdam`` over the user's own parameter groups where
    :func:`why_not_swapped` finds no reason against it, else the user's optimizer."""
    if why_not_swapped(optimizer, zero, device) is not None:
        return optimizer
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    defaults = optimizer.defaults
    swapped: torch.optim.Optimizer = DeepSpeedCPUAdam(
        optimizer.param_groups,  # (the same dicts: see the module's docstring)
        lr=defaults["lr"],
        betas=defaults["betas"],
        eps=defaults["eps"],
        weight_decay=defaults["weight_decay"],
        adamw_mode=bool(optimizer.param_groups[0].get("decoupled_weight_decay")),  # (AdamW's, or Adam's flag)
    )
    return swapped


def cpu_adam_is_built() -> bool:
    """DeepSpeed's ``cpu_adam`` loads without a compile: installed prebuilt, or in the extensions folder."""
    try:
        from deepspeed.git_version_info import installed_ops
    except ImportError:
        return False
    if installed_ops.get(CPU_ADAM_OP):
        return True
    folder = os.environ.get("TORCH_EXTENSIONS_DIR")  # (the pool sets it for its workers)
    return folder is not None and (Path(folder) / CPU_ADAM_OP / f"{CPU_ADAM_OP}.so").exists()
