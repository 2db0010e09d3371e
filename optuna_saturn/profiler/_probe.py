"""Describing a trial before anything is launched: its model's shape, its batch's shape, its first loop's length.

The objective runs in a process of the pool (the describer, :mod:`optuna_saturn.pools.describer_host`; never the
executor's) with a stand-in trial, up to its first ``trial.steps(n)`` loop and no further: no training step, no
evaluation, nothing after. Its ``suggest_*`` go to the real trial (the sampler in the executor decides the trial's
hyperparameters once). Only the *parameters* of modules built meanwhile go to PyTorch's meta device
(Accelerate's ``init_empty_weights``), so even a 6B-parameter model is described in milliseconds without
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
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import optuna
import torch

from optuna_saturn.process_state import restored_process_state
from optuna_saturn.profiler._description import NothingToDescribe, ProbeDone
from optuna_saturn.profiler._memory import optimizer_states
from optuna_saturn.profiler._stand_in import BATCHES_BEFORE_THE_LOOP, StandInTrial, Suggests, first_batch
from optuna_saturn.profiler._without_gpus import without_gpus
from optuna_saturn.training.microbatch import AccumulationError, batch_rows, tensors_of

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

    torch.nn.Module.to = to  # type: ignore[method-assign, assignment]  # patched while describing: see above
    try:
        yield
    finally:
        torch.nn.Module.to = original  # type: ignore[method-assign]  # torch's own, put back


def probe_workload(objective: Any, trial: Suggests, lock: threading.Lock, *, throwaway: bool = False) -> Workload:
    """Describe ``objective``'s workload for ``trial`` (see the module's docstring). Raises ``RuntimeError`` with
    the reason when the objective cannot be described this way (then the trial is planned from estimates).
    ``throwaway``: this process ends after the description (the describer's fork), so the global state the
    objective changed is not put back (putting it back imports every library that keeps one: 1.4 s here)."""
    from accelerate import init_empty_weights

    probe = StandInTrial(trial, lock)
    # (the GPUs hidden around the state put back too: putting it back resets torch._dynamo, which asks
    # torch.cuda.is_available(), and asked with the GPUs in sight that initialises CUDA in this process)
    with without_gpus(), contextlib.nullcontext() if throwaway else restored_process_state():
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
            raise NothingToDescribe(
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

    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False
    ) -> float:
        return low

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        return low

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        return next(iter(choices))


def warm_up(objective: Any) -> bool:
    """Run ``objective`` up to its first training loop with placeholder hyperparameters, as the description
    does, in this process: what it imports lazily (transformers' model classes, say) is then imported once here,
    before warm workers are forked from this process. Any error is ignored: this is only a warm-up. Returns
    whether the objective reached its loop or its end without preparing anything for a strategy (a plain
    objective: the strategies' libraries, seconds of imports, are then not needed before its trials)."""
    from accelerate import init_empty_weights

    stand_in = StandInTrial(_FirstValues(), threading.Lock())
    with restored_process_state():
        try:
            with init_empty_weights(include_buffers=False), meta_models_stay_put():
                objective(stand_in)
        except ProbeDone:
            pass
        except BaseException:
            return False
    return not stand_in.asked_for_training
