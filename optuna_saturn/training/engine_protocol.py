"""What a trial's training helpers ask of its strategy's engine, declared on their side.

Why here: the engines (:mod:`optuna_saturn.engines`) use the helpers' checkpoints and sharded loaders, and the
trial (:class:`~optuna_saturn.training.training_trial.TrainingTrial`) drives an engine. Declared here, the
helpers sit below the engines, and the engines implement this without either importing the other back."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader


class RankContext(Protocol):
    """Where a rank stands in its trial's process group."""

    @property
    def rank(self) -> int: ...
    @property
    def local_rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def gradient_accumulation(self) -> int: ...
    @property
    def strategy(self) -> str: ...


class TrainingEngine(Protocol):
    """A strategy's engine, as the trial's helpers use it (:class:`optuna_saturn.engines.Engine` implements it)."""

    @property
    def context(self) -> RankContext: ...

    @property
    def shards_parameters(self) -> bool: ...

    @property
    def counts_micro_batches(self) -> bool: ...

    @property
    def takes_a_loss_scaler(self) -> bool: ...

    @property
    def checkpoint_format(self) -> str: ...

    def release(self) -> None: ...

    def prepare_model_and_optimizer(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
    ) -> tuple[torch.nn.Module, Any]: ...

    def prepare_dataloader(self, loader: DataLoader, on_batch: Callable[..., Any]) -> DataLoader: ...

    def backward(
        self, loss: torch.Tensor, model: torch.nn.Module | None, *, weight: float = 1.0, last_micro_batch: bool = True
    ) -> None: ...

    def gradient_sync(self, model: torch.nn.Module | None, sync: bool) -> AbstractContextManager[None]: ...

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module: ...

    def user_module(self, model: torch.nn.Module) -> torch.nn.Module: ...

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, Any]: ...
