"""An objective that initialises CUDA when the pool host warms it up (runs it up to its loop before forking the
workers), as ``TrainingArguments(...)`` or ``torch.cuda.is_available()`` do on a GPU machine: faked here (this CPU
build cannot), in the host only, by what torch reports."""

from __future__ import annotations

import torch
from gpu_objectives import ranks_environment


def objective(trial) -> float:
    with open("/proc/self/comm", encoding="ascii") as comm:
        if comm.read().strip() == "saturn-host":
            torch.cuda.is_initialized = lambda: True
    return ranks_environment(trial)
