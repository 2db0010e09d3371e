"""A dry run of the objective in the executor's process, on PyTorch's meta device.

It calls the objective with a stand-in trial whose ``suggest_*`` go to the real trial (so the trial's
hyperparameters are decided here, once) and whose ``prepare`` records the model's structure and the batch shape,
then stops the objective when it asks for its step budget. Models built under the meta device allocate no
memory, so even a 6B-parameter model is described in milliseconds. This is what lets a profile be looked up
before any process is launched: trials that differ only in learning rate share one.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from collections.abc import Iterator
from typing import Any

import optuna
import torch
from torch.utils.data import DataLoader

_logger = optuna.logging.get_logger("optuna.saturn.profiler")


class _ProbeDone(BaseException):
    """Raised out of the objective once the probe has seen what it needs (BaseException: not caught by the
    objective's own ``except Exception``)."""


@dataclass(frozen=True)
class Workload:
    """What affects a trial's speed, as seen by the dry run."""

    model_signature: str  # hash of parameter names, shapes and dtypes
    n_params: int
    bytes_per_param: int
    batch_signature: str  # global batch size and one sample's shapes and dtypes
    total_steps: int
    global_batch: int | None = None  # the DataLoader's batch size: how far micro-batching can split it

    def to_json(self) -> dict:
        return dict(self.__dict__)


class _ProbeLoader:
    """Stands in for a prepared DataLoader: creating an iterator works (a real one would draw a seed, which the
    meta device cannot), taking a batch ends the probe."""

    def __init__(self, loader: DataLoader) -> None:
        self._loader = loader
        self.batch_size = loader.batch_size
        self.dataset = loader.dataset

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> "_ProbeLoader":
        return self

    def __next__(self) -> Any:
        raise _ProbeDone


class _ProbeTrial:
    def __init__(self, trial: optuna.Trial, lock: threading.Lock) -> None:
        self._trial = trial
        self._lock = lock
        self.number = trial.number
        self.strategy = None  # not chosen yet: the dry run comes before planning
        self.rank = self.local_rank = 0
        self.world_size = 1
        self.is_main_process = True
        self.is_profiling = False
        self.gradient_accumulation = 1
        self.device = torch.device("meta")
        self.model: torch.nn.Module | None = None
        self.loader: DataLoader | None = None

    def _suggest(self, method: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return getattr(self._trial, method)(*args, **kwargs)

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False):
        return self._suggest("suggest_float", name, low, high, step=step, log=log)

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False):
        return self._suggest("suggest_int", name, low, high, step=step, log=log)

    def suggest_categorical(self, name: str, choices: Any):
        return self._suggest("suggest_categorical", name, list(choices))

    @property
    def params(self) -> dict:
        return dict(self._trial.params)

    def report(self, value: float, step: int) -> None:
        raise _ProbeDone  # training started without trial.steps(): nothing more to learn

    def should_prune(self) -> bool:
        raise _ProbeDone

    def set_user_attr(self, key: str, value: Any) -> None:
        pass

    def prepare(self, *objects: Any) -> Any:
        prepared: list[Any] = []
        for obj in objects:
            if isinstance(obj, torch.nn.Module):
                self.model = obj
            elif isinstance(obj, DataLoader):
                self.loader = self.loader or obj
                obj = _ProbeLoader(obj)
            prepared.append(obj)
        return prepared[0] if len(prepared) == 1 else tuple(prepared)

    def micro_batches(self, batch: Any) -> Iterator[Any]:
        yield batch

    def backward(self, loss: torch.Tensor) -> None:
        raise _ProbeDone

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def reduce_mean(self, value: Any) -> float:
        raise _ProbeDone

    def barrier(self) -> None:
        pass

    def step_budget(self, steps: int) -> int:
        return steps

    def steps(self, total: int):
        self.total_steps = int(total)
        raise _ProbeDone
        yield  # pragma: no cover  (makes this a generator, like SaturnTrial.steps)


def _model_signature(model: torch.nn.Module) -> tuple[str, int, int]:
    digest = hashlib.sha256()
    n_params = 0
    bytes_per_param = 4
    for name, p in model.named_parameters():
        digest.update(f"{name}:{tuple(p.shape)}:{p.dtype};".encode())
        n_params += p.numel()
        bytes_per_param = p.element_size()
    return digest.hexdigest()[:20], n_params, bytes_per_param


def _batch_signature(loader: DataLoader) -> str:
    sample = loader.dataset[0]
    items = sample if isinstance(sample, (tuple, list)) else [sample]
    shapes = [(tuple(t.shape), str(t.dtype)) if isinstance(t, torch.Tensor) else type(t).__name__ for t in items]
    return f"batch={loader.batch_size};sample={shapes}"


def probe_workload(objective: Any, trial: optuna.Trial, lock: threading.Lock) -> Workload:
    """Dry-run ``objective`` for ``trial`` on the meta device. Raises ``RuntimeError`` with the reason when the
    objective cannot be described this way (then the trial is planned from estimates instead)."""
    probe = _ProbeTrial(trial, lock)
    try:
        with torch.device("meta"):
            objective(probe)
    except _ProbeDone:
        pass
    except Exception as exc:
        raise RuntimeError(f"the dry run on the meta device raised {type(exc).__name__}: {exc}") from exc
    if probe.model is None or probe.loader is None or not hasattr(probe, "total_steps"):
        raise RuntimeError(
            "the objective must call trial.prepare(model, ..., dataloader) and then iterate trial.steps(n) "
            "for its runtime to be profiled"
        )
    model_sig, n_params, bytes_per_param = _model_signature(probe.model)
    return Workload(
        model_sig, n_params, bytes_per_param, _batch_signature(probe.loader), probe.total_steps,
        probe.loader.batch_size,
    )
