"""Describing objectives written the Hugging Face way (``trial.prepare_trainer``, ``trial.accelerator()``): the
same description as for ``trial.prepare`` + ``trial.steps`` (model, first batch, first loop's length), read from a
``transformers.Trainer`` or through a stand-in ``Accelerator``."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch

from optuna_saturn.profiler._description import Description, ProbeDone


def describe_trainer(probe: Description, trainer: Any) -> None:
    """The trainer's model, its training DataLoader and its number of optimizer steps (its one loop)."""
    args = trainer.args
    loader = trainer.get_train_dataloader()
    with contextlib.suppress(Exception):  # its class is part of the description; Trainer makes it in train()
        probe.optimizer = trainer.create_optimizer()
    probe.model = trainer.model
    probe.loader = loader
    if args.max_steps > 0:
        probe.total_steps = int(args.max_steps)
    else:
        batches, accumulation = len(loader), args.gradient_accumulation_steps
        per_epoch = max(batches // accumulation + int(batches % accumulation > 0), 1)
        probe.total_steps = math.ceil(args.num_train_epochs * per_epoch)
    raise ProbeDone


class ProbeAccelerator:
    """Stands in for ``trial.accelerator()`` while describing: ``prepare`` is the probe's (it records the model
    and the DataLoaders); iterating a prepared DataLoader is the first training loop (its length is the loop's),
    and ends the description."""

    is_main_process = is_local_main_process = True
    num_processes = 1
    process_index = local_process_index = 0
    gradient_accumulation_steps = 1
    sync_gradients = True

    def __init__(self, probe: Description) -> None:
        self._probe = probe

    @property
    def device(self) -> torch.device:
        return self._probe.device

    def prepare(self, *args: Any, device_placement: Any = None) -> Any:
        return self._probe.prepare(*args, loaders_are_loops=True)

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        raise ProbeDone

    @contextlib.contextmanager
    def accumulate(self, *models: Any) -> Iterator[None]:
        yield

    def print(self, *args: Any, **kwargs: Any) -> None:
        print(*args, **kwargs)

    def wait_for_everyone(self) -> None:
        pass

    def unwrap_model(self, model: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        return model
