from __future__ import annotations

import copy
from typing import Any

import torch
from torch.utils.data import DataLoader

from optuna_saturn.engines._base import Engine


class _EngineOptimizer:
    """What ``prepare`` returns for the optimizer under DeepSpeed: ``step()`` is the engine's step (which also
    zeroes gradients), so the user's ordinary ``optimizer.step()`` / ``zero_grad()`` loop stays unchanged."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.optimizer = engine.optimizer  # the ZeRO stage's own optimizer

    def step(self, closure: Any = None) -> None:
        self.engine.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass  # the engine zeroes gradients in step()

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()


class DeepSpeedEngine(Engine):
    """DeepSpeed ZeRO (stage and offload from the strategy's ``launcher_config``), through
    ``deepspeed.initialize`` so it is real on CPU too."""

    def prepare_model_and_optimizer(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
    ) -> tuple[torch.nn.Module, Any]:
        import deepspeed

        if self.context.knobs.get("activation_checkpointing"):
            from optuna_saturn.engines._blocks import enable_activation_checkpointing

            enable_activation_checkpointing(model)
        config = copy.deepcopy(self.context.launcher_config)
        # The trial's own loop decides the batch; these only need to be consistent for DeepSpeed's bookkeeping,
        # except the accumulation, which DeepSpeed applies itself (loss scaling, optimizer step at the boundary).
        config.setdefault("train_micro_batch_size_per_gpu", 1)
        config["gradient_accumulation_steps"] = self.context.gradient_accumulation
        config["train_batch_size"] = (
            config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * self.context.world_size
        )
        config.setdefault("zero_allow_untested_optimizer", True)
        config.setdefault("zero_force_ds_cpu_optimizer", False)  # the user's torch optimizer, even with offload
        config.setdefault("steps_per_print", 10**9)
        config.setdefault("gradient_clipping", 0.0)  # DeepSpeed would clip at 1.0 unasked; clipping is the user's call
        engine, ds_optimizer, _, _ = deepspeed.initialize(
            model=model.to(self.context.device), optimizer=optimizer, config=config,
            dist_init_required=False,
        )
        return engine, (None if optimizer is None else _EngineOptimizer(engine))

    def prepare_dataloader(self, loader: DataLoader) -> DataLoader:
        return self.shard_dataloader(loader)

    def backward(
        self, loss: torch.Tensor, model: torch.nn.Module | None, *, share: float = 1.0, last_micro_batch: bool = True
    ) -> None:
        accumulation = self.context.gradient_accumulation
        weight = share * accumulation  # DeepSpeed divides by gradient_accumulation_steps itself
        model.backward(loss * weight if weight != 1.0 else loss)
        if not last_micro_batch:
            # DeepSpeed counts micro-batches in step(): before the boundary it only advances the count. The
            # user's optimizer.step() after the last micro-batch is the step at the boundary.
            model.step()

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return getattr(model, "module", model)
