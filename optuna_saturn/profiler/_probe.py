"""Describing a trial before anything is launched: its model's shape, its batch's shape, its first loop's length.

The objective runs in the executor's process with a stand-in trial, up to its first ``trial.steps(n)`` loop and no
further: no training step, no evaluation, nothing after. Its ``suggest_*`` go to the real trial (so the trial's
hyperparameters are decided here, once). Only the *parameters* of modules built meanwhile go to PyTorch's meta
device (Accelerate's ``init_empty_weights``), so even a 6B-parameter model is described in milliseconds without
allocating it; every other tensor the objective makes (its data, caches it writes to disk) is real, exactly as in a
worker. The batch's shape is read from one real batch of the user's DataLoader, collated by its own
``collate_fn``, so sequence lengths set by a collate function or hidden in dict samples count. Global state the
objective may touch (random generators, default dtype, threads, environment, working folder) is restored after.

This is what lets a profile be looked up before any process is launched: trials that differ only in learning rate
share one.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import optuna
import torch
from torch.utils.data import DataLoader, IterableDataset

from optuna_saturn.microbatch import AccumulationError, batch_rows, tensors_of
from optuna_saturn.profiler._memory import optimizer_states
from optuna_saturn.profiler._probe_hf import ProbeAccelerator, describe_trainer
from optuna_saturn.profiler._probe_stop import ProbeDone
from optuna_saturn.profiler._without_gpus import without_gpus
from optuna_saturn.study_view import StudyView
from optuna_saturn.worker.process_state import restored_process_state

_logger = optuna.logging.get_logger("optuna.saturn.profiler")


@dataclass(frozen=True)
class Work:
    """What a workload asks of a step: its FLOPs and its parameters' bytes."""

    flops: float
    param_bytes: float

    @classmethod
    def of(cls, n_params: int, bytes_per_param: int, tokens_per_step: float) -> Work:
        return cls(6.0 * n_params * max(tokens_per_step, 1.0), float(n_params * bytes_per_param))


@dataclass(frozen=True)
class Workload:
    """What affects a trial's speed, as seen by the description run."""

    model_signature: str  # hash of parameter names, shapes and dtypes, and of the optimizer's class
    n_params: int
    bytes_per_param: int
    batch_signature: str  # the global batch's tensors: shapes and dtypes
    total_steps: int  # the first trial.steps(n) loop's n (later loops are counted by profiling runs)
    global_batch: int | None = None  # rows of a global batch: how far micro-batching can split it
    tokens_per_step: int = 0  # rows x sequence length of a global batch (rows, for data without sequences)
    optimizer_states: int = 0  # parameter-sized state tensors its optimizer keeps (Adam: 2), for memory estimates

    @property
    def work(self) -> Work:
        """What a step asks of a device, for the cost model."""
        return Work.of(self.n_params, self.bytes_per_param, self.tokens_per_step or self.global_batch or 1)

    def to_json(self) -> dict:
        return dict(self.__dict__)


#: Batches an objective may take from its prepared DataLoaders before its ``trial.steps()`` loop (to read their
#: shapes, a first forward pass, an evaluation pass); taking more ends the description (it never reached its loop).
BATCHES_BEFORE_THE_LOOP = 64


class _ProbeLoader:
    """Stands in for a prepared DataLoader: a batch taken before the objective's ``trial.steps()`` loop is the
    loader's real first batch (a pass ends after ``len(loader)`` of them; ``BATCHES_BEFORE_THE_LOOP`` in all), and
    one taken in the loop ends the probe (no real work happens after the description). For an objective whose
    loop is a pass over the loader (an Accelerate script), iterating it first is that loop: ``loop_of`` records
    its length, and its first batch ends the probe."""

    def __init__(self, loader: DataLoader, probe: _ProbeTrial, *, is_the_loop: bool = False) -> None:
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


class _ProbeTrial:
    def __init__(self, trial: optuna.Trial, lock: threading.Lock) -> None:
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

    def _suggest(self, method: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return getattr(self._trial, method)(*args, **kwargs)

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False):
        return self._suggest("suggest_float", name, low, high, step=step, log=log)

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False):
        return self._suggest("suggest_int", name, low, high, step=step, log=log)

    def suggest_categorical(self, name: str, choices: Any):
        return self._suggest("suggest_categorical", name, list(choices))

    def suggest_uniform(self, name: str, low: float, high: float):
        return self._suggest("suggest_float", name, low, high)

    def suggest_loguniform(self, name: str, low: float, high: float):
        return self._suggest("suggest_float", name, low, high, log=True)

    def suggest_discrete_uniform(self, name: str, low: float, high: float, q: float):
        return self._suggest("suggest_float", name, low, high, step=q)

    def set_constraint(self, key: str, value: float) -> None:
        pass  # (the real run sets it)

    def _read(self, name: str, default: Any) -> Any:
        with self._lock:
            return getattr(self._trial, name, default)

    @property
    def params(self) -> dict:
        return dict(self._trial.params)

    @property
    def distributions(self) -> dict:
        return self._read("distributions", {})

    @property
    def user_attrs(self) -> dict:
        return self._read("user_attrs", {})

    @property
    def constraints(self) -> dict:
        return self._read("constraints", {})

    @property
    def relative_params(self) -> dict:
        return self._read("relative_params", {})

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
        prepared: list[Any] = []
        for obj in objects:
            if isinstance(obj, torch.nn.Module):
                self.model = obj
            elif isinstance(obj, torch.optim.Optimizer):
                self.optimizer = obj
            elif isinstance(obj, DataLoader):
                self.loader = self.loader or obj
                obj = _ProbeLoader(obj, self, is_the_loop=loaders_are_loops)
            prepared.append(obj)
        return prepared[0] if len(prepared) == 1 else tuple(prepared)

    def prepare_trainer(self, trainer: Any, *, metric: str = "eval_loss") -> Any:
        describe_trainer(self, trainer)

    def accelerator(self, **kwargs: Any) -> Any:
        return ProbeAccelerator(self)

    def lightning_trainer(self, *, metric: str = "val_loss", checkpoints: bool = True, **kwargs: Any) -> Any:
        from optuna_saturn.profiler._probe_lightning import ProbeLightningTrainer

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

    def steps(self, total: int, *, start: int = 0):
        self.total_steps = int(total)
        raise ProbeDone
        yield  # pragma: no cover  (makes this a generator, like SaturnTrial.steps)


def _model_signature(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> tuple[str, int, int]:
    """Parameter names, shapes and dtypes, and the optimizer's class (its step costs differ, and whether a strategy
    can run it at all: ZeRO needs an element-wise one)."""
    digest = hashlib.sha256(f"optimizer={type(optimizer).__qualname__ if optimizer else None};".encode())
    n_params = 0
    bytes_per_param = 4
    for name, p in model.named_parameters():
        digest.update(f"{name}:{tuple(p.shape)}:{p.dtype};".encode())
        n_params += p.numel()
        bytes_per_param = p.element_size()
    return digest.hexdigest()[:20], n_params, bytes_per_param


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


def _shapes(batch: Any, path: str = "") -> list[str]:
    if isinstance(batch, torch.Tensor):
        return [f"{path}:{tuple(batch.shape)}:{batch.dtype}"]
    if isinstance(batch, Mapping):
        return [s for k in sorted(batch, key=str) for s in _shapes(batch[k], f"{path}.{k}")]
    if isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        if batch and all(
            not isinstance(v, (torch.Tensor, Mapping, Sequence)) or isinstance(v, (str, bytes)) for v in batch
        ):
            return [f"{path}:list[{len(batch)}]"]
        return [s for i, v in enumerate(batch) for s in _shapes(v, f"{path}[{i}]")]
    return [f"{path}:{type(batch).__name__}"]


def _batch_signature(batch: Any) -> tuple[str, int | None, int]:
    """The batch's tensors (shapes, dtypes), its rows, and its tokens: rows x length of the first integer
    tensor with two dimensions (token ids), else its rows."""
    try:
        rows: int | None = batch_rows(batch)
    except AccumulationError:
        rows = None
    ids = [t for t in tensors_of(batch) if t.dim() >= 2 and not t.is_floating_point()]
    tokens = ids[0].shape[0] * ids[0].shape[1] if ids else (rows or 0)
    return ";".join(_shapes(batch)), rows, int(tokens)


@contextlib.contextmanager
def meta_models_stay_put() -> Iterator[None]:
    """While describing, modules have no weights (meta tensors), and code that moves a model (Trainer moves it to
    its device when it is created) would fail: moving a module with meta parameters is a no-op meanwhile."""
    original = torch.nn.Module.to

    def to(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if any(p.is_meta for p in module.parameters()):
            return module
        return original(module, *args, **kwargs)

    torch.nn.Module.to = to  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.to = original  # type: ignore[method-assign]


def probe_workload(objective: Any, trial: optuna.Trial, lock: threading.Lock) -> Workload:
    """Describe ``objective``'s workload for ``trial`` (see the module's docstring). Raises ``RuntimeError`` with
    the reason when the objective cannot be described this way (then the trial is planned from estimates)."""
    from accelerate import init_empty_weights

    probe = _ProbeTrial(trial, lock)
    with restored_process_state(), without_gpus():
        try:
            with init_empty_weights(include_buffers=False), meta_models_stay_put():
                objective(probe)
        except ProbeDone:
            pass
        except Exception as exc:
            raise RuntimeError(
                f"describing it before its first trial.steps() loop raised {type(exc).__name__}: {exc}"
            ) from exc
        if probe.model is None or probe.loader is None or probe.total_steps is None:
            took = (
                (
                    f" (it took {probe.batches_before_the_loop} batches from its DataLoaders without reaching a "
                    "trial.steps() loop)"
                )
                if probe.batches_before_the_loop >= BATCHES_BEFORE_THE_LOOP
                else ""
            )
            raise RuntimeError(
                "the objective must call trial.prepare(model, ..., dataloader) and then iterate trial.steps(n), "
                "or train through trial.prepare_trainer(trainer) or trial.accelerator(), for its runtime to be "
                f"profiled{took}"
            )
        try:
            signature, rows, tokens = _batch_signature(first_batch(probe.loader))
        except Exception as exc:
            raise RuntimeError(f"reading one batch of its DataLoader raised {type(exc).__name__}: {exc}") from exc
    model_sig, n_params, bytes_per_param = _model_signature(probe.model, probe.optimizer)
    return Workload(
        model_sig,
        n_params,
        bytes_per_param,
        signature,
        probe.total_steps,
        probe.loader.batch_size if probe.loader.batch_size is not None else rows,
        tokens,
        optimizer_states(probe.optimizer),
    )


class _FirstValues:
    """Stands in for an Optuna trial with placeholder hyperparameters: each search space's first value."""

    number = -1
    params: ClassVar[dict] = {}  # (read only: nothing is ever suggested into it)

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False):
        return low

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False):
        return low

    def suggest_categorical(self, name: str, choices: Any):
        return next(iter(choices))


def warm_up(objective: Any) -> None:
    """Run ``objective`` up to its first training loop with placeholder hyperparameters, as the description
    does, in this process: what it imports lazily (transformers' model classes, say) is then imported once here,
    before warm workers are forked from this process. Any error is ignored: this is only a warm-up."""
    from accelerate import init_empty_weights

    with restored_process_state():
        try:
            with init_empty_weights(include_buffers=False), meta_models_stay_put():
                objective(_ProbeTrial(_FirstValues(), threading.Lock()))  # type: ignore[arg-type]
        except BaseException:
            pass
