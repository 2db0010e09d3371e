"""The stand-in trial that describes an objective before anything is launched (see :mod:`._probe`): its
``suggest_*`` go to the real trial, its helpers record the model, optimizer, loader and first loop's length, and
its first training step ends the description."""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, IterableDataset

from optuna_saturn.profiler._description import ProbeDone
from optuna_saturn.profiler._probe_hf import ProbeAccelerator, describe_trainer
from optuna_saturn.study_view import StudyView

#: Batches an objective may take from its prepared DataLoaders before its ``trial.steps()`` loop (to read their
#: shapes, a first forward pass, an evaluation pass); taking more ends the description (it never reached its loop).
BATCHES_BEFORE_THE_LOOP = 64


class StandInLoader:
    """Stands in for a prepared DataLoader: a batch taken before the objective's ``trial.steps()`` loop is the
    loader's real first batch (a pass ends after ``len(loader)`` of them; ``BATCHES_BEFORE_THE_LOOP`` in all), and
    one taken in the loop ends the probe (no real work happens after the description). For an objective whose
    loop is a pass over the loader (an Accelerate script), iterating it first is that loop: ``loop_of`` records
    its length, and its first batch ends the probe."""

    def __init__(self, loader: DataLoader, probe: StandInTrial, *, is_the_loop: bool = False) -> None:
        self._loader = loader
        self._probe = probe
        self._loop_of = probe if is_the_loop else None
        self._first: Any = None
        self.batch_size = loader.batch_size
        self.dataset = loader.dataset

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[Any]:
        if self._loop_of is not None and self._loop_of.total_steps is None:
            with contextlib.suppress(TypeError):  # an IterableDataset without a length: no loop length to learn
                self._loop_of.total_steps = len(self._loader)
        return self._one_pass()

    def _one_pass(self) -> Iterator[Any]:
        try:
            length = len(self._loader)
        except TypeError:  # an IterableDataset without a length: its passes end at the budget
            length = None
        probe, taken = self._probe, 0
        while length is None or taken < length:
            if self._loop_of is not None or probe.total_steps is not None:
                raise ProbeDone  # the training loop's first batch: described
            if probe.batches_before_the_loop >= BATCHES_BEFORE_THE_LOOP:
                raise ProbeDone  # (reported: it never reached a trial.steps() loop)
            probe.batches_before_the_loop += 1
            taken += 1
            if self._first is None:
                self._first = first_batch(self._loader)
            yield self._first


class Suggests(Protocol):
    """What the stand-in asks of the trial it stands in for: an ``optuna.Trial``, or placeholder values (the
    warm-up's first values of each search space)."""

    @property
    def number(self) -> int: ...

    @property
    def params(self) -> dict[str, Any]: ...

    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False
    ) -> float: ...

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int: ...

    def suggest_categorical(self, name: str, choices: Any) -> Any: ...


class StandInTrial:
    """What ``objective(trial)`` gets while it is described: mirrors :class:`~optuna_saturn.SaturnTrial`."""

    def __init__(self, trial: Suggests, lock: threading.Lock) -> None:
        self._trial = trial
        self._lock = lock
        self.number = trial.number
        self.strategy = None  # not chosen yet: the description comes before planning
        self.rank = self.local_rank = 0
        self.world_size = 1
        self.is_main_process = True
        self.is_profiling = False
        self.is_real_run = False  # (describing, or the pool's warm-up: never the run that counts)
        self.gradient_accumulation = 1
        self.device = torch.device("meta")  # where the model's parameters are: nothing runs on them
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.loader: DataLoader | None = None
        self.total_steps: int | None = None
        self.batches_before_the_loop = 0  # taken from a prepared DataLoader before its trial.steps() loop
        self.asked_for_training = False  # it prepared something, or asked for a Trainer, an Accelerator

    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False
    ) -> float:
        with self._lock:
            return self._trial.suggest_float(name, low, high, step=step, log=log)

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        with self._lock:
            return self._trial.suggest_int(name, low, high, step=step, log=log)

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        with self._lock:
            return self._trial.suggest_categorical(name, list(choices))

    def suggest_uniform(self, name: str, low: float, high: float) -> float:
        with self._lock:
            return self._trial.suggest_float(name, low, high)

    def suggest_loguniform(self, name: str, low: float, high: float) -> float:
        with self._lock:
            return self._trial.suggest_float(name, low, high, log=True)

    def suggest_discrete_uniform(self, name: str, low: float, high: float, q: float) -> float:
        with self._lock:
            return self._trial.suggest_float(name, low, high, step=q)

    def set_constraint(self, key: str, value: float) -> None:
        pass  # (the real run sets it)

    def _read(self, name: str, default: Any) -> Any:
        with self._lock:
            return getattr(self._trial, name, default)

    def _read_dict(self, name: str) -> dict:
        found: dict = self._read(name, {})  # (distributions, user_attrs...: dicts on an Optuna trial)
        return found

    @property
    def params(self) -> dict:
        return dict(self._trial.params)

    @property
    def distributions(self) -> dict:
        return self._read_dict("distributions")

    @property
    def user_attrs(self) -> dict:
        return self._read_dict("user_attrs")

    @property
    def constraints(self) -> dict:
        return self._read_dict("constraints")

    @property
    def relative_params(self) -> dict:
        return self._read_dict("relative_params")

    @property
    def datetime_start(self) -> Any:
        return self._read("datetime_start", None)

    @property
    def study(self) -> StudyView:
        """The same read-only view the worker's trial gives."""
        study = self._read("study", None)
        if study is None:
            return StudyView({})
        with self._lock:
            return StudyView(
                {
                    "study_name": study.study_name,
                    "directions": [d.name for d in study.directions],
                    "user_attrs": study.user_attrs,
                }
            )

    def report(self, value: float, step: int) -> None:
        pass

    def should_prune(self) -> bool:
        return False

    def set_user_attr(self, key: str, value: Any) -> None:
        pass

    def prepare(self, *objects: Any, loaders_are_loops: bool = False) -> Any:
        self.asked_for_training = True
        prepared: list[Any] = []
        for obj in objects:
            if isinstance(obj, torch.nn.Module):
                self.model = obj
            elif isinstance(obj, torch.optim.Optimizer):
                self.optimizer = obj
            elif isinstance(obj, DataLoader):
                self.loader = self.loader or obj
                obj = StandInLoader(obj, self, is_the_loop=loaders_are_loops)
            prepared.append(obj)
        return prepared[0] if len(prepared) == 1 else tuple(prepared)

    def prepare_trainer(self, trainer: Any, *, metric: str = "eval_loss") -> Any:
        self.asked_for_training = True
        describe_trainer(self, trainer)

    def accelerator(self, **kwargs: Any) -> Any:
        self.asked_for_training = True
        return ProbeAccelerator(self)

    def lightning_trainer(self, *, metric: str = "val_loss", checkpoints: bool = True, **kwargs: Any) -> Any:
        from optuna_saturn.profiler._probe_lightning import ProbeLightningTrainer

        self.asked_for_training = True
        return ProbeLightningTrainer(self, kwargs)

    def micro_batches(self, batch: Any) -> Iterator[Any]:
        yield batch

    def backward(self, loss: torch.Tensor) -> None:
        raise ProbeDone  # training started without trial.steps(): nothing more to learn

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def state_dict(self, model: torch.nn.Module) -> dict:
        return {}

    def reduce_mean(self, value: Any, weight: float | None = None) -> float:
        return 0.0

    def barrier(self) -> None:
        pass

    def step_budget(self, steps: int) -> int:
        return steps

    def restore(self, model: torch.nn.Module, optimizer: Any = None, scheduler: Any = None) -> int:
        return 0  # (the description is of the whole trial, as a first run)

    def checkpoint(self, step: int, model: torch.nn.Module, optimizer: Any = None, scheduler: Any = None) -> None:
        pass

    def steps(self, total: int, *, start: int = 0) -> Iterator[int]:
        self.total_steps = int(total)
        raise ProbeDone
        yield  # pragma: no cover  (makes this a generator, like SaturnTrial.steps)


def first_batch(loader: DataLoader) -> Any:
    """One global batch of ``loader``, made by its own sampler, dataset and ``collate_fn`` (in this process: no
    worker processes are started)."""
    dataset = loader.dataset
    if isinstance(dataset, IterableDataset):
        if loader.batch_size is None:
            return loader.collate_fn(next(iter(dataset)))
        return loader.collate_fn(list(itertools.islice(iter(dataset), loader.batch_size)))
    if loader.batch_sampler is None:
        return loader.collate_fn(dataset[next(iter(loader.sampler))])
    indices = list(next(iter(loader.batch_sampler)))
    getitems = getattr(dataset, "__getitems__", None)
    return loader.collate_fn(getitems(indices) if getitems else [dataset[i] for i in indices])
