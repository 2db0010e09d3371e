"""What the description of a trial fills in, and how it ends: the stand-ins for a training framework (a
``transformers.Trainer``, an ``Accelerator``, a Lightning ``Trainer``) fill in the same description as
``trial.prepare`` + ``trial.steps``, then the objective is stopped from inside, once the probe has what it needs."""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader


class ProbeDone(BaseException):
    """Raised out of the objective once the probe has seen what it needs (BaseException: not caught by the
    objective's own ``except Exception``)."""


class NothingToDescribe(RuntimeError):
    """The objective ran without preparing a model and a DataLoader and reaching a ``trial.steps()`` loop (or a
    Trainer, an Accelerator): it has nothing to describe, and a sweep describes no more of its trials."""


class DescribeTimedOut(RuntimeError):
    """The objective did not reach its first training loop within the describe limit: a slow set-up, or a hang.
    Its trial is planned from runtime estimates and runs, where its start-up limit ends a hang."""


class DescribeFailed(Exception):
    """The objective ended the process that described it (``os._exit``, ``sys.exit``, a signal) before its first
    training loop: its trial fails with this reason, without a run. ``raised``:
    the exception it raised (:mod:`optuna_saturn.raised`), if that is how it ended."""

    def __init__(self, reason: str, *, raised: dict | None = None) -> None:
        super().__init__(reason)
        self.raised = raised


class Description(Protocol):
    """The stand-in trial as a framework's stand-in sees it: what it fills in, and ``prepare`` for the rest."""

    device: torch.device
    model: torch.nn.Module | None
    optimizer: torch.optim.Optimizer | None
    loader: DataLoader | None
    total_steps: int | None

    def prepare(self, *objects: Any, loaders_are_loops: bool = False) -> Any: ...
