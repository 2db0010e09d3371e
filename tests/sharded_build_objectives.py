"""Objectives for the sharded construction of a model (tests/test_sharded_build.py): each rank's peak host memory
while the model is built and prepared, and the value the prepared model computes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from gpu_objectives import WideMLP
from objectives import regression_data

from optuna_saturn.engines._sharded_build import give_back_freed_memory

#: 256 blocks of 1024 x 1024: 1 GiB in float32, in modules of 4 MiB. A model that fits only halved is a large
#: model, and large models are built of many modules: a rank's peak is half the model, and a few of its largest
#: parameters whole for a moment (one built before it is cut; under zero3, one gathered for DeepSpeed to partition).
MANY_BLOCKS = {"width": 1024, "depth": 256}


def host_memory(key: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (the peak since the last reset) of this process, in bytes."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith(key + ":"))
    return int(line.split()[1]) * 1024


def built_then_evaluated(trial) -> float:
    """Builds the model as a user does (seeded, before ``trial.prepare``), prepares it alone, and returns its loss
    on fixed data (the whole batch on every rank): the value single computes from the same build. Records each
    rank's host-memory peak over its resident memory when the objective began, through ``trial.prepare``."""
    import deepspeed  # noqa: F401  # (imported first, as a warm worker may have: its import is not the model's memory)

    give_back_freed_memory()  # (memory a previous job freed, still resident, would hide this one's)
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # (resets VmHWM to VmRSS: the peak of this objective only, in a worker used before)
    started = host_memory("VmRSS")
    torch.manual_seed(0)
    kind = trial.suggest_categorical("model", ["mlp", "gpt2"])
    model = build(kind)
    built = host_memory("VmHWM") - started
    with peak_before_deepspeed_initialize() as partitioned:
        model = trial.prepare(model)
    prepared = host_memory("VmHWM") - started
    peaks = [None] * trial.world_size
    dist.all_gather_object(
        peaks, {"built": built, "prepared": prepared, "partitioned": partitioned and partitioned[0] - started}
    )
    trial.set_user_attr("host_peaks", peaks)
    with torch.no_grad():
        return float(loss_of(kind, model, trial.device))


@contextlib.contextmanager
def peak_before_deepspeed_initialize() -> Iterator[list[int]]:
    """The host-memory peak (``VmHWM``) once ZeRO-3 has partitioned the model, when ``deepspeed.initialize`` is
    called: what DeepSpeed's engine allocates then is the device's state (its partitions in the compute dtype,
    buffers), which on a CPU device is host memory too."""
    import deepspeed

    seen: list[int] = []

    initialize = deepspeed.initialize

    def recorded(*args: Any, **kwargs: Any) -> Any:
        seen.append(host_memory("VmHWM"))
        return initialize(*args, **kwargs)

    deepspeed.initialize = recorded
    try:
        yield seen
    finally:
        deepspeed.initialize = initialize


def build(kind: str) -> torch.nn.Module:
    """The MLP of :data:`MANY_BLOCKS`, or a GPT-2 from a config (Hugging Face's ``post_init`` initialises its
    weights again once every module is built)."""
    if kind == "gpt2":
        from hf_objectives import tiny_gpt2

        return tiny_gpt2()
    return WideMLP(MANY_BLOCKS["width"], MANY_BLOCKS["depth"])


def loss_of(kind: str, model: torch.nn.Module, device: torch.device) -> torch.Tensor:
    """The model's loss on fixed data: a regression for the MLP, next tokens for GPT-2."""
    if kind == "mlp":
        x, y = regression_data(64).tensors
        return torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
    from hf_objectives import Tokens

    ids = Tokens(4, seed=1).ids.to(device)
    return model(input_ids=ids, labels=ids).loss
