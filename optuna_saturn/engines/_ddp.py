from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.nn.parallel import DistributedDataParallel

from optuna_saturn.engines._base import Engine


class DDPEngine(Engine):
    """A full replica per process; DistributedDataParallel all-reduces gradients during backward."""

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        model = model.to(self.context.device)
        if self.context.world_size == 1:
            return model
        device_ids = [self.context.device.index] if self.context.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)

    @contextlib.contextmanager
    def gradient_sync(self, model: torch.nn.Module | None, sync: bool) -> Iterator[None]:
        if sync or not isinstance(model, DistributedDataParallel):
            yield
            return
        with model.no_sync():  # gradients accumulate locally; the last micro-batch all-reduces their sum
            yield

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model
