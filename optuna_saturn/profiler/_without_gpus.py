"""A process that describes or warms up a trial's objective must not touch a GPU (see :func:`without_gpus`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def without_gpus() -> Iterator[None]:
    """While the objective is described (in the executor) or warmed up (in the pool host, whose workers are its
    forks), it must not touch a GPU: ``TrainingArguments`` calls ``torch.cuda.set_device("cuda:0")`` on a machine
    with GPUs, and ``torch.cuda.is_available()`` initialises the driver; the process would then hold a context on
    GPU 0 for the whole sweep, and its forks could not use CUDA. So the GPUs are hidden meanwhile, availability is
    asked of NVML (no driver initialised), and Accelerate and Trainer take their CPU path. DeepSpeed, if imported
    meanwhile, is told which accelerator the GPUs in sight would have made it pick (it keeps its first pick). A
    launcher's variables (this process runs under ``torchrun``, say) are hidden too: Accelerate would start a
    process group on seeing them."""
    hidden = {"CUDA_VISIBLE_DEVICES": "", "PYTORCH_NVML_BASED_CUDA_CHECK": "1", "ACCELERATE_USE_CPU": "true"}
    if torch.cuda._is_compiled() and "DS_ACCELERATOR" not in os.environ:
        hidden["DS_ACCELERATOR"] = "cuda" if torch.cuda.device_count() else "cpu"
    saved = {name: os.environ.get(name) for name in (*hidden, *_LAUNCHER_VARIABLES)}
    for name in _LAUNCHER_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(hidden)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


_LAUNCHER_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)
