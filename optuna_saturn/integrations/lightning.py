"""A ``lightning.Trainer`` run as an optuna-saturn trial: ``trial.lightning_trainer(...)`` where the script says
``lightning.Trainer(...)``.

Why not Lightning's own strategies (``"ddp"``, ``"fsdp"``, ``"deepspeed_stage_2"``): they expect to launch or find
their own processes, Lightning refuses FSDP and DeepSpeed on CPU, and the strategy is the sweep's choice for each
trial, not the script's. The trainer gets a :class:`SaturnStrategy` instead: a Lightning strategy that hands the
model, its optimizer and the DataLoaders to ``trial.prepare`` and the backward pass to ``trial.backward``, inside
the warm workers' process group. So FSDP really shards and ZeRO is really ZeRO, on CPU too, and the trial computes
what it computes on one device (the DataLoader's ``batch_size`` is the global batch; each rank gets its rows).
A callback makes the optimizer steps the trial's steps (progress, runtime profiling) and each validation a
``trial.report`` that prunes every rank when the study's pruner says so, as optuna-integration's
``PyTorchLightningPruningCallback`` would.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.strategies.strategy import _ForwardRedirection
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from torch.utils.data import DataLoader

from optuna_saturn.engines import StrategyMismatch
from optuna_saturn.integrations._lightning_arguments import (
    FOLLOWS_THE_TRIAL,
    as_list,
    own_folders,
    refuse_conflicts,
    wants_checkpoints,
)
from optuna_saturn.integrations._lightning_callback import TrialCallback, restore_lightning_state
from optuna_saturn.integrations._lightning_precision import precision_plugin
from optuna_saturn.study.folders import safe
from optuna_saturn.training.microbatch import AccumulationError

if TYPE_CHECKING:
    from optuna_saturn.training.training_trial import TrainingTrial

#: What ``lightning_trainer`` passes itself (the values of FOLLOWS_THE_TRIAL, checked, stand for these).
_SET_HERE = {*FOLLOWS_THE_TRIAL, "accelerator", "use_distributed_sampler"}


def lightning_trainer(
    trial: TrainingTrial, *, metric: str = "val_loss", checkpoints: bool = True, **kwargs: Any
) -> pl.Trainer:
    """See :meth:`optuna_saturn.SaturnTrial.lightning_trainer`."""
    refuse_conflicts(
        kwargs,
        runs_as=f"this trial runs '{trial.strategy.name}' on {trial.world_size} device(s)",
        device_type=trial.device.type,
    )
    engine = trial._engine
    if trial.gradient_accumulation > 1:
        raise AccumulationError(
            f"The planner would split each batch into {trial.gradient_accumulation} micro-batches for "
            f"'{trial.strategy.name}', which a Lightning Trainer cannot follow from outside; this option is left "
            "out for the trial. Set accumulate_grad_batches in the Trainer to accumulate yourself."
        )
    if engine.counts_micro_batches and kwargs.get("accumulate_grad_batches", 1) != 1:
        raise StrategyMismatch(
            f"'{trial.strategy.name}' (DeepSpeed) counts micro-batches itself and cannot follow the Trainer's "
            "accumulate_grad_batches > 1; the planner leaves it out for this trial."
        )
    # (a run again that goes on from the earlier trial's checkpoint goes on in that trial's folders too)
    retry_of = trial.user_attrs.get("saturn:retry_of") if trial.resumes else None
    run = f"{safe(trial.study.study_name)}-trial-{trial.number if retry_of is None else retry_of}"
    private = tempfile.mkdtemp(prefix="saturn-profile-") if trial.is_profiling else None  # (removed with the Trainer)
    own_folders(kwargs, run, resumes=trial.resumes and trial.rank == 0, private=private)
    kwargs["enable_checkpointing"] = wants_checkpoints(kwargs)  # (the trial checkpoints through trial.checkpoint)
    kwargs.setdefault("enable_progress_bar", False)  # one bar per rank per trial would flood the workers' logs
    kwargs.setdefault("enable_model_summary", False)
    kwargs["callbacks"] = [*as_list(kwargs.get("callbacks")), TrialCallback(trial, metric, checkpoints=checkpoints)]
    accelerator = "cuda" if trial.device.type == "cuda" else "cpu"
    strategy = SaturnStrategy(trial)
    trainer = pl.Trainer(
        **{k: v for k, v in kwargs.items() if k not in _SET_HERE},
        strategy=strategy,
        accelerator=accelerator,
        devices=1,
        num_nodes=1,
        plugins=[precision_plugin(strategy, trial, kwargs.get("precision"))],
        use_distributed_sampler=False,
    )
    if private is not None:
        weakref.finalize(trainer, shutil.rmtree, private, True)
    return trainer


class SaturnStrategy(Strategy):
    """A Lightning strategy that applies the trial's optuna-saturn strategy (``single``, ``ddp``, ``fsdp*``, the
    ZeRO stages, offload) through the trial's engine, in the process group the trial already runs in.

    Made by :meth:`~optuna_saturn.SaturnTrial.lightning_trainer`; not a strategy to pass to a Trainer yourself.
    One optimizer (automatic optimization) is supported, as by ``trial.prepare``."""

    def __init__(self, trial: TrainingTrial) -> None:
        super().__init__()
        self._trial = trial
        self._forward_redirection = _ForwardRedirection()
        self._prepared: dict[int, torch.nn.Module] = {}  # id(LightningModule) -> the engine's model

    # -- where this process is -----------------------------------------------------------------------------------
    @property
    def root_device(self) -> torch.device:
        return self._trial.device

    @property
    def is_global_zero(self) -> bool:
        return self._trial.is_main_process

    @property
    def global_rank(self) -> int:
        return self._trial.rank

    @property
    def local_rank(self) -> int:
        return self._trial.local_rank

    @property
    def node_rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return self._trial.world_size

    @property
    def is_distributed(self) -> bool:
        """Read by Lightning for custom strategies: ``self.log(..., sync_dist=True)`` syncs over the ranks only
        when true."""
        return self._trial.world_size > 1

    def setup_environment(self) -> None:
        # Lightning logs and warns on global rank 0 only (the rank is an attribute Lightning sets on its function)
        rank_zero_only.rank = self._trial.rank  # type: ignore[attr-defined]  # see above
        super().setup_environment()

    # -- the model, its optimizer, the data: the trial's engine ---------------------------------------------------
    def model_to_device(self) -> None:
        """``setup`` hands the model to the engine, which places (or shards) it."""

    def setup(self, trainer: pl.Trainer) -> None:
        assert self.accelerator is not None and self.model is not None
        self.accelerator.setup(trainer)
        if trainer.state.fn != "fit":  # validate, test, predict: the model as fit prepared it, if it did
            module = self.lightning_module
            self.model = self._prepared.get(id(module)) or self._trial.prepare(self.model)
            self._prepared[id(module)] = self.model
            return
        self.setup_optimizers(trainer)
        if len(self.optimizers) != 1:
            raise ValueError(
                f"configure_optimizers() returned {len(self.optimizers)} optimizers; an optuna-saturn trial trains "
                "with one (automatic optimization). Combine the parameter groups into one optimizer."
            )
        self.model, optimizer = self._trial.prepare(self.model, self.optimizers[0])
        self._prepared[id(self.lightning_module)] = self.model
        if optimizer is not self.optimizers[0]:  # (a sharding engine's: the same parameter groups)
            for config in self.lr_scheduler_configs:
                config.scheduler.optimizer = optimizer
        self.optimizers = [optimizer]
        self.setup_precision_plugin()
        schedulers = self.lr_scheduler_configs
        _, state = self._trial._load_checkpoint(self.model, optimizer, schedulers[0].scheduler if schedulers else None)
        if state is not None:  # an earlier run of this trial checkpointed: the fit goes on from there
            restore_lightning_state(trainer, state)

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        """What a ModelCheckpoint file keeps of the optimizer: its state under single and DDP; nothing under a
        strategy that shards it (each rank holds a part, and the file is rank 0's). The model in the file is
        whole under every strategy (:meth:`lightning_module_state_dict`); the trial's own checkpoint keeps every
        rank's part of the optimizer for resuming."""
        engine = self._trial._engine
        if engine.shards_parameters or engine.counts_micro_batches:
            return {}
        return super().optimizer_state(optimizer)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """One decision for every rank (EarlyStopping's, ModelCheckpoint's): all agree, or any says so."""
        if self.world_size == 1:
            return decision
        votes = self.reduce(torch.tensor(int(decision), device=self.root_device), reduce_op="sum")
        return bool(votes == self.world_size) if all else bool(votes > 0)

    def process_dataloader(self, dataloader: object) -> object:
        """The trial's rows of each batch. Only training loaders keep their position for a checkpoint: Lightning
        prepares the validation loader first in one run (its sanity check) and after the training one in a
        resumed run, and a validation pass is never cut by the trial's checkpoint (taken after it ends)."""
        if not isinstance(dataloader, DataLoader):
            return dataloader
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        self._trial._positions_kept = trainer is None or trainer.training
        try:
            return self._trial.prepare(dataloader)
        finally:
            self._trial._positions_kept = True

    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Lightning's order (the precision's hooks scale the loss under fp16, and call ``on_before_backward`` and
        ``on_after_backward``), with the backward pass itself the trial's."""
        self.pre_backward(closure_loss)
        assert self.lightning_module is not None
        closure_loss = self.precision_plugin.pre_backward(closure_loss, self.lightning_module)
        self._trial.backward(closure_loss)
        closure_loss = self.precision_plugin.post_backward(closure_loss, self.lightning_module)
        self.post_backward(closure_loss)
        return closure_loss

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The whole model's, on rank 0, under every strategy (gathering shards is collective)."""
        assert self.model is not None
        return self._trial.state_dict(self.model)

    # -- forward passes go through the engine's wrapper (DDP's hooks, FSDP's gathers, DeepSpeed's engine) ---------
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        assert self.model is not None and self.lightning_module is not None  # (set up before any step)
        with self.precision_plugin.train_step_context():
            return self._forward_redirection(self.model, self.lightning_module, "training_step", *args, **kwargs)

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        assert self.model is not None and self.lightning_module is not None  # (set up before any step)
        with self.precision_plugin.val_step_context():
            return self._forward_redirection(self.model, self.lightning_module, "validation_step", *args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        assert self.model is not None and self.lightning_module is not None  # (set up before any step)
        with self.precision_plugin.test_step_context():
            return self._forward_redirection(self.model, self.lightning_module, "test_step", *args, **kwargs)

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        assert self.model is not None and self.lightning_module is not None  # (set up before any step)
        with self.precision_plugin.predict_step_context():
            return self._forward_redirection(self.model, self.lightning_module, "predict_step", *args, **kwargs)

    # -- collectives over the trial's ranks -----------------------------------------------------------------------
    def _group(self) -> Any:
        return self._trial._group

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        if not isinstance(tensor, torch.Tensor) or self.world_size == 1:
            return tensor
        op = str(getattr(reduce_op, "name", reduce_op) or "mean").lower().replace("redop", "").lstrip(".")
        result = tensor.detach().clone().to(self.root_device)
        dist.all_reduce(
            result,
            op={"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}.get(op, dist.ReduceOp.SUM),
            group=self._group(),
        )
        return result / self.world_size if op in ("mean", "avg") else result

    def barrier(self, name: str | None = None) -> None:
        self._trial.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if self.world_size == 1:
            return obj
        holder = [obj]
        dist.broadcast_object_list(holder, src=src, group=self._group())
        return holder[0]

    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        if self.world_size == 1:
            return tensor.unsqueeze(0)
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous(), group=self._group())
        return torch.stack(parts)

    def teardown(self) -> None:
        """Lightning's own teardown moves the module to the CPU; the trial's engine owns it (and the process
        group), and ``trial.state_dict(trainer.strategy.model)`` after ``fit`` needs it where it is."""
        self.precision_plugin.teardown()
        if self.accelerator is not None:
            self.accelerator.teardown()
