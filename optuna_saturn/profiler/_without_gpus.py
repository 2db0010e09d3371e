"""A process that describes or warms up a trial's objective must not touch a GPU (see :func:`without_gpus`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from optuna_saturn.nvml import visible_gpu_count
from optuna_saturn.profiler._transformers_hidden import transformers_while_gpus_are_hidden


@contextlib.contextmanager
def without_gpus() -> Iterator[None]:
    """While the objective is described (in the executor) or warmed up (in the pool host, whose workers are its
    forks), it must not touch a GPU: ``TrainingArguments`` calls ``torch.cuda.set_device("cuda:0")`` on a machine
    with GPUs, and ``torch.cuda.is_available()`` initialises the driver; the process would then hold a context on
    GPU 0 for the whole sweep, and its forks could not use CUDA. So the GPUs are hidden meanwhile, availability is
    asked of NVML (no driver initialised), and Accelerate and Trainer take their CPU path. DeepSpeed, if imported
    meanwhile, is told which accelerator the GPUs in sight would have made it pick (it keeps its first pick). A
    launcher's variables (this process runs under ``torchrun``, say) are hidden too: Accelerate would start a
    process group on seeing them. transformers' hardware checks are answered for the hidden GPUs, and what it
    caches of them meanwhile is forgotten (:mod:`._transformers_hidden`).

    The GPUs in sight are counted by NVML, not by ``torch.cuda``: where NVML cannot tell, torch's count falls back
    to CUDA's and initialises the driver in this process (the executor, or the pool host whose forks are the
    workers), which must never happen here."""
    hidden = {"CUDA_VISIBLE_DEVICES": "", "PYTORCH_NVML_BASED_CUDA_CHECK": "1", "ACCELERATE_USE_CPU": "true"}
    if torch.cuda._is_compiled() and "DS_ACCELERATOR" not in os.environ:
        hidden["DS_ACCELERATOR"] = "cuda" if visible_gpu_count() else "cpu"
    saved = {name: os.environ.get(name) for name in (*hidden, *_LAUNCHER_VARIABLES)}
    for name in _LAUNCHER_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(hidden)
    try:
        with transformers_while_gpus_are_hidden():
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
