from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler


@dataclass(frozen=True)
class WorkerContext:
    """Where this worker process stands in its trial's process group."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    knobs: dict
    launcher_config: dict = field(default_factory=dict)
    gradient_accumulation: int = 1


class _EpochAwareLoader(DataLoader):
    """A sharded DataLoader that advances its DistributedSampler's epoch on every pass, so shuffling differs
    between epochs without the user having to call ``set_epoch``."""

    def __iter__(self) -> Any:
        sampler = self.sampler
        epoch = getattr(self, "_saturn_epoch", 0)
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(epoch)
        self._saturn_epoch = epoch + 1
        return super().__iter__()


class Engine:
    """Applies one strategy. Subclasses override the ``prepare_*`` steps that differ; the defaults suit a
    single process."""

    def __init__(self, context: WorkerContext) -> None:
        self.context = context

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self.context.device)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> Any:
        return optimizer

    def prepare_model_and_optimizer(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
    ) -> tuple[torch.nn.Module, Any]:
        """Most strategies wrap the model first and keep the optimizer; sharding ones must see both at once."""
        model = self.prepare_model(model)
        return model, (None if optimizer is None else self.prepare_optimizer(optimizer, model))

    def prepare_dataloader(self, loader: DataLoader) -> DataLoader:
        return loader

    def backward(
        self, loss: torch.Tensor, model: torch.nn.Module | None, *, share: float = 1.0, last_micro_batch: bool = True
    ) -> None:
        """Accumulated gradients must add up to the whole batch's mean: each micro-batch's mean loss counts by
        its ``share`` of the batch's rows."""
        (loss * share if share != 1.0 else loss).backward()

    @contextlib.contextmanager
    def gradient_sync(self, model: torch.nn.Module | None, sync: bool) -> Iterator[None]:
        """Around one micro-batch: whether its backward synchronises gradients across ranks. Only the last
        micro-batch of a step needs to; strategies that can skip the others do."""
        yield

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def shard_dataloader(self, loader: DataLoader) -> DataLoader:
        """Give each rank its share of every global batch: the trial's batch size stays the same whatever the
        device count, so a trial's result does not depend on how it was parallelised."""
        world = self.context.world_size
        if world == 1:
            return loader
        if loader.batch_size is None:
            raise ValueError("trial.prepare() needs a DataLoader built with batch_size=..., not a batch_sampler.")
        if loader.batch_size % world:
            raise ValueError(
                f"The DataLoader's batch size {loader.batch_size} does not split evenly over {world} processes. "
                f"Use a batch size divisible by {world}, or restrict this trial to other device counts."
            )
        sampler = DistributedSampler(
            loader.dataset, num_replicas=world, rank=self.context.rank,
            shuffle=isinstance(loader.sampler, RandomSampler), drop_last=loader.drop_last,
        )
        return _EpochAwareLoader(
            loader.dataset, batch_size=loader.batch_size // world, sampler=sampler,
            num_workers=loader.num_workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
            drop_last=loader.drop_last, worker_init_fn=loader.worker_init_fn, generator=loader.generator,
        )


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
