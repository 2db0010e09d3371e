"""Describing an objective written with Lightning (``trial.lightning_trainer(...)``): the same description as for
``trial.prepare`` + ``trial.steps`` (model, first batch, first loop's length), read from what ``fit`` is given."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

from optuna_saturn.profiler._description import Description, ProbeDone

#: Lightning's own default when neither ``max_epochs`` nor ``max_steps`` is given.
_LIGHTNING_DEFAULT_EPOCHS = 1000


class ProbeLightningTrainer:
    """Stands in for ``trial.lightning_trainer(...)`` while describing: ``fit`` records the module, its optimizer
    and its training DataLoader, counts the optimizer steps the fit would take, and ends the description. The
    arguments are checked as the real one checks them, so a conflict is reported before anything is launched."""

    def __init__(self, probe: Description, kwargs: dict[str, Any]) -> None:
        from optuna_saturn.integrations._lightning_arguments import refuse_conflicts

        refuse_conflicts(kwargs, runs_as="the sweep picks each trial's strategy and devices", device_type=None)
        self._probe = probe
        self._kwargs = kwargs

    def fit(
        self,
        model: Any,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        datamodule: Any = None,
        ckpt_path: Any = None,
    ) -> None:
        loader = _training_loader(model, train_dataloaders, datamodule)
        optimizer = None
        with contextlib.suppress(Exception):  # its class is part of the description (it may need a trainer)
            optimizer = _first_optimizer(model.configure_optimizers())
        self._probe.prepare(*(o for o in (model, optimizer, loader) if o is not None))
        self._probe.total_steps = self._optimizer_steps(loader)
        raise ProbeDone

    def _optimizer_steps(self, loader: Any) -> int:
        max_steps = self._kwargs.get("max_steps", -1)
        if max_steps is not None and max_steps > 0:
            return int(max_steps)
        try:
            batches = len(loader)
        except TypeError:  # an IterableDataset without a length: only max_steps says
            return 1
        limit = self._kwargs.get("limit_train_batches")
        if isinstance(limit, int):
            batches = min(batches, limit)
        elif isinstance(limit, float):
            batches = int(batches * limit)
        accumulation = int(self._kwargs.get("accumulate_grad_batches", 1))
        epochs = self._kwargs.get("max_epochs") or _LIGHTNING_DEFAULT_EPOCHS
        return max(math.ceil(batches / accumulation), 1) * int(epochs)

    def __getattr__(self, name: str) -> Any:  # validate, test, callback_metrics...: never reached in a description
        raise ProbeDone


def _training_loader(model: Any, train_dataloaders: Any, datamodule: Any) -> Any:
    source = train_dataloaders if train_dataloaders is not None else datamodule
    if source is not None and hasattr(source, "train_dataloader"):  # a LightningDataModule
        source.prepare_data()
        source.setup("fit")
        return source.train_dataloader()
    if source is not None:
        return source
    return model.train_dataloader()


def _first_optimizer(configured: Any) -> torch.optim.Optimizer | None:
    """The optimizer in whatever ``configure_optimizers`` returned (one, a list, a dict, or lists)."""
    if isinstance(configured, torch.optim.Optimizer):
        return configured
    if isinstance(configured, dict):
        return _first_optimizer(configured.get("optimizer"))
    if isinstance(configured, (list, tuple)) and configured:
        return _first_optimizer(configured[0])
    return None
