from __future__ import annotations

from typing import Any

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy, fully_shard
from torch.utils.data import DataLoader

from optuna_saturn.engines._base import Engine
from optuna_saturn.engines._blocks import enable_activation_checkpointing, repeated_blocks


class FSDPEngine(Engine):
    """FSDP2 (``fully_shard``): parameters, gradients and optimizer state sharded over ranks, each block
    gathered only while it computes. Applied with the torch API itself, so it is real on CPU/gloo too, where
    ``accelerate --use_fsdp`` would silently run DDP.

    With gradient accumulation, every micro-batch reduce-scatters its gradients (the default ``gradient_sync``):
    skipping that would keep whole, unsharded gradients on every rank until the last micro-batch, and
    accumulation is chosen precisely when memory is short."""

    def prepare_model_and_optimizer(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
    ) -> tuple[torch.nn.Module, Any]:
        group_ids = [] if optimizer is None else [[id(p) for p in g["params"]] for g in optimizer.param_groups]
        if self.context.knobs.get("activation_checkpointing"):
            enable_activation_checkpointing(model)
        # Parameter objects survive checkpoint wrapping (their names may not): name them only now.
        names = {id(p): n for n, p in model.named_parameters()}
        group_names = [[names[i] for i in ids] for ids in group_ids]
        model = model.to(self.context.device)
        device_type = self.context.device.type
        mesh = init_device_mesh(device_type, (self.context.world_size,))
        offload: OffloadPolicy = OffloadPolicy()
        if self.context.knobs.get("cpu_offload"):  # pinned host memory exists only beside an accelerator
            offload = CPUOffloadPolicy(pin_memory=device_type == "cuda")
        for block in repeated_blocks(model):
            fully_shard(block, mesh=mesh, offload_policy=offload)
        fully_shard(model, mesh=mesh, offload_policy=offload)
        if optimizer is None:
            return model, None
        # fully_shard replaced every parameter with a sharded one: rebuild the optimizer over those, by name.
        by_name = dict(model.named_parameters())
        rebuilt = type(optimizer)(
            [
                {**{k: v for k, v in g.items() if k != "params"}, "params": [by_name[n] for n in params]}
                for g, params in zip(optimizer.param_groups, group_names)
            ],
            **optimizer.defaults,
        )
        return model, rebuilt

    def prepare_dataloader(self, loader: DataLoader) -> DataLoader:
        return self.shard_dataloader(loader)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model


def is_sharded(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)
