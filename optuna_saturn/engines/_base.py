from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from optuna_saturn.strategy.engine_traits import EngineTraits
from optuna_saturn.training.sharding import OnBatch, ShardedDataLoader

if TYPE_CHECKING:
    from optuna_saturn.engines._sharded_build import ShardedBuild


def sharded_build_off() -> bool:
    """``OPTUNA_SATURN_SHARDED_BUILD=off``: models are built whole on every rank, as before (for objectives whose
    code before ``trial.prepare`` touches parameters on some ranks only: a cut parameter is gathered from every
    rank, a collective, and would wait for the ranks that never touch it)."""
    return os.environ.get("OPTUNA_SATURN_SHARDED_BUILD", "on").lower() in ("off", "0", "false", "no")


class StrategyMismatch(ValueError):
    """The trial's code cannot run under this strategy and compute what it computes in one process. Not a failure
    of the trial: the planner gives it another option. The message says why, and how to avoid it."""


def refuse_a_loss_scaler(optimizer: object, strategy: str) -> None:
    """fp16 with a loss scaler (``torch.amp.GradScaler``, Accelerate's or Lightning's ``16-mixed``) under a strategy
    that lays the gradients out its own way (``Engine.takes_a_loss_scaler`` False): the scaler's overflow check and
    unscaling would see none of them (or one rank's shard), and steps it should skip would be taken. An optimizer
    that declares ``_step_supports_amp_scaling`` is handed the scaler's verdict (``found_inf``) before its step:
    seeing it is how the strategy learns a scaler drives it."""
    if "found_inf" in vars(optimizer):
        raise loss_scaler_mismatch(strategy)


def loss_scaler_mismatch(strategy: str) -> StrategyMismatch:
    return StrategyMismatch(
        f"fp16 with a loss scaler (torch.amp.GradScaler, mixed_precision='fp16', precision='16-mixed') cannot run "
        f"under '{strategy}': the scaler checks and unscales gradients as one process holds them, and "
        f"'{strategy}' shards them. The planner leaves this strategy out for this trial; train in bf16 (it needs no "
        "scaler) to run it under every strategy."
    )


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
    control_group: Any = None  # a gloo group of the trial's ranks, for small CPU-side collectives
    strategy: str = ""


class Engine:
    """Applies one strategy. Subclasses override the steps that differ; the defaults suit a single process.

    Whatever the strategy, the user's loop must compute what it computes in one process: the same batches, the
    same gradients, the same optimizer (an LR scheduler made before or after ``trial.prepare`` drives it), the
    same clipping, the same saved weights. Where a strategy cannot, the engine raises an error naming the way
    that works.
    """

    @property
    def shards_parameters(self) -> bool:
        """Each rank holds only a shard of the parameters: the user's module cannot be handed out whole."""
        return False

    #: The engine counts micro-batches itself (DeepSpeed): accumulation driven from outside its own knob, such as
    #: Trainer's ``gradient_accumulation_steps``, cannot be followed.
    counts_micro_batches = False
    #: How trial.checkpoint() saves this engine's training state (see :mod:`optuna_saturn.training.checkpoint`): as
    #: its traits declare it (:func:`optuna_saturn.engines.engine_class` checks that the two agree).
    checkpoint_format = EngineTraits.checkpoint_format
    #: A loss scaler (fp16) sees the gradients as one process holds them (see :func:`refuse_a_loss_scaler`).
    takes_a_loss_scaler = True

    def __init__(self, context: WorkerContext) -> None:
        self.context = context
        self._build: ShardedBuild | None = None  # the sharded construction of this run's model (model_construction)

    def model_construction(self) -> contextlib.AbstractContextManager:
        """Around the objective until ``trial.prepare``: under a strategy that shards parameters over several
        ranks, each module is cut to this rank's chunk as soon as it is built, so that no rank holds the whole
        model in host memory (see :mod:`optuna_saturn.engines._sharded_build`)."""
        if not self.shards_parameters or self.context.world_size == 1 or sharded_build_off():
            return contextlib.nullcontext()
        from optuna_saturn.engines._sharded_build import ShardedBuild

        self._build = ShardedBuild(self.context.rank, self.context.world_size, self.context.control_group)
        return self._build

    def built_chunks(self, model: torch.nn.Module) -> dict[int, torch.Tensor]:
        """This rank's chunk of each of ``model``'s parameters that were cut while it was built, by ``id`` (those
        parameters hold one element); empty where the model was built whole."""
        build, self._build = self._build, None
        return {} if build is None else build.finish(model)

    def release(self) -> None:
        """The run is over: drop what the engine still references of it (so its memory can be freed before the
        next run in this process), and what it registered for clipping."""
        from optuna_saturn.engines import _clipping

        _clipping.forget_all()

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self.context.device)

    def prepare_model_and_optimizer(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
    ) -> tuple[torch.nn.Module, Any]:
        """Most strategies wrap the model and keep the user's optimizer object; sharding ones must see both."""
        return self.prepare_model(model), optimizer

    def prepare_dataloader(self, loader: DataLoader, on_batch: OnBatch) -> DataLoader:
        """This rank's part of every global batch of the user's loader (see :mod:`optuna_saturn.training.sharding`); a
        single process keeps the user's loader as it is."""
        if self.context.world_size == 1:
            return loader
        return ShardedDataLoader(
            loader,
            rank=self.context.rank,
            world_size=self.context.world_size,
            group=self.context.control_group,
            on_batch=on_batch,
        )

    def backward(
        self, loss: torch.Tensor, model: torch.nn.Module | None, *, weight: float = 1.0, last_micro_batch: bool = True
    ) -> None:
        """The ranks' averaged gradients must be the whole batch's: each piece's mean loss counts by ``weight``
        (its rows' part of the batch, see :func:`~optuna_saturn.training.microbatch.partition`)."""
        (loss * weight if weight != 1.0 else loss).backward()

    @contextlib.contextmanager
    def gradient_sync(self, model: torch.nn.Module | None, sync: bool) -> Iterator[None]:
        """Around one micro-batch: whether its backward synchronises gradients across ranks. Only the last
        micro-batch of a step needs to; strategies that can skip the others do."""
        yield

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def user_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """The user's module inside the strategy's wrapper, for forward passes and attributes even when its
        parameters are sharded (then it is no use for saving: see :meth:`full_state_dict`)."""
        return model if self.shards_parameters else self.unwrap(model)

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, Any]:
        """The whole model's state dict, as one process would have it, on rank 0; other ranks get an empty dict
        (whatever the strategy, so code that saves on rank 0 works under all). Call it on every rank: gathering
        shards is collective."""
        return self.unwrap(model).state_dict() if self.context.rank == 0 else {}

    def clip_grad_norm(
        self,
        model: torch.nn.Module,
        parameters: Iterable[torch.nn.Parameter],
        max_norm: float,
        norm_type: float,
        **kwargs: Any,
    ) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over the whole model's gradients, however they are laid out."""
        from optuna_saturn.engines._clipping import original_clip_grad_norm

        return original_clip_grad_norm(parameters, max_norm, norm_type, **kwargs)

    def refuse_unwrap(self) -> None:
        raise ValueError(
            f"Under '{self.context.strategy}' each rank holds only a shard of the model's parameters, so "
            "trial.unwrap(model) cannot give the whole module (its state_dict() would hold shards or nothing). "
            "To save the model, call `state = trial.state_dict(model)` on every rank (it gathers the full state "
            "dict onto rank 0), then `if trial.is_main_process: torch.save(state, path)`. Use the prepared model "
            "itself for forward passes and attributes."
        )


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
