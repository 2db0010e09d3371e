from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from optuna_saturn.engines._base import Engine


class DDPEngine(Engine):
    """A full replica per process; DistributedDataParallel all-reduces gradients during backward."""

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        model = model.to(self.context.device)
        if self.context.world_size == 1:
            return model
        device_ids = [self.context.device.index] if self.context.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)

    def prepare_dataloader(self, loader: DataLoader) -> DataLoader:
        return self.shard_dataloader(loader)

    @contextlib.contextmanager
    def gradient_sync(self, model: torch.nn.Module | None, sync: bool) -> Iterator[None]:
        if sync or not isinstance(model, DistributedDataParallel):
            yield
            return
        with model.no_sync():  # gradients accumulate locally; the last micro-batch all-reduces their sum
            yield

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model
