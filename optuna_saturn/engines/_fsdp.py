from __future__ import annotations

import functools
import types
from typing import Any

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy, fully_shard

from optuna_saturn.engines._base import Engine, StrategyMismatch, refuse_a_loss_scaler
from optuna_saturn.engines._blocks import enable_activation_checkpointing, repeated_blocks
from optuna_saturn.engines._sharded_build import give_back_freed_memory


class FSDPEngine(Engine):
    """FSDP2 (``fully_shard``): parameters, gradients and optimizer state sharded over ranks, each block
    gathered only while it computes. Applied with the torch API itself, so it is real on CPU/gloo too, where
    ``accelerate --use_fsdp`` would silently run DDP.

    With gradient accumulation, every micro-batch reduce-scatters its gradients (the default ``gradient_sync``):
    skipping that would keep whole, unsharded gradients on every rank until the last micro-batch, and
    accumulation is chosen precisely when memory is short."""

    shards_parameters = True
    takes_a_loss_scaler = False

    def prepare_model_and_optimizer(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
    ) -> tuple[torch.nn.Module, Any]:
        if optimizer is not None and optimizer.state:
            raise ValueError(
                "The optimizer already has state (optimizer.step() ran before trial.prepare()). Call "
                "trial.prepare(model, optimizer, ...) before training: sharding strategies replace the parameters."
            )
        group_ids = [] if optimizer is None else [[id(p) for p in g["params"]] for g in optimizer.param_groups]
        chunks = self.built_chunks(model)
        if self.context.knobs.get("activation_checkpointing"):
            enable_activation_checkpointing(model)
        # Parameter objects survive checkpoint wrapping (their names may not): name them only now.
        names = {id(p): n for n, p in model.named_parameters()}
        foreign = [i for ids in group_ids for i in ids if i not in names]
        if foreign:
            raise ValueError(
                f"The optimizer holds {len(foreign)} tensor(s) that are not parameters of the model passed to "
                "trial.prepare(); give trial.prepare() the model whose parameters the optimizer updates."
            )
        group_names = [[names[i] for i in ids] for ids in group_ids]
        # No model.to(device) first: fully_shard moves each block's states to the device itself and keeps only its
        # shard, block by block, so a model that fits the devices only when sharded never sits whole on one.
        for param in model.parameters():
            if id(param) in chunks:  # fully_shard shards a meta parameter as it stands, and takes no strided one
                meta = torch.nn.Parameter(torch.empty_like(param, device="meta"), requires_grad=param.requires_grad)
                torch.utils.swap_tensors(param, meta)
        device_type = self.context.device.type
        mesh = init_device_mesh(device_type, (self.context.world_size,))
        offload: OffloadPolicy = OffloadPolicy()
        if self.context.knobs.get("cpu_offload"):  # pinned host memory exists only beside an accelerator
            offload = CPUOffloadPolicy(pin_memory=device_type == "cuda")
        for block in repeated_blocks(model):
            fully_shard(block, mesh=mesh, offload_policy=offload)
        fully_shard(model, mesh=mesh, offload_policy=offload)
        if chunks:
            by_name = {names[i]: chunk for i, chunk in chunks.items()}
            chunks.clear()  # (each chunk is freed once it is in its shard)
            _fill_shards(model, by_name, self.context.device)
        if optimizer is not None:
            # fully_shard replaced every parameter with a sharded one. Point the user's own optimizer at those, in
            # place: its class, settings and param groups stay, and so does any LR scheduler already bound to it.
            by_name = dict(model.named_parameters())
            for group, params in zip(optimizer.param_groups, group_names):
                group["params"] = [by_name[n] for n in params]
            self._name_dtensor_failures(optimizer)
        return model, optimizer

    def _name_dtensor_failures(self, optimizer: torch.optim.Optimizer) -> None:
        """Torch's optimizers run on sharded (DTensor) parameters; one from elsewhere may not (Adafactor makes
        plain tensors of a parameter's full shape). Its first step then fails: say so, as a mismatch."""
        step, strategy, name = optimizer.step, self.context.strategy, type(optimizer).__name__

        @functools.wraps(step)
        def step_on_shards(_optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            refuse_a_loss_scaler(_optimizer, strategy)
            try:
                return step(*args, **kwargs)
            except (RuntimeError, NotImplementedError, TypeError) as exc:
                if "DTensor" not in str(exc):
                    raise
                raise StrategyMismatch(
                    f"{name} cannot step the sharded (DTensor) parameters of '{strategy}': {exc}. The planner leaves "
                    f"this strategy out for this trial; to silence it, use a torch optimizer (AdamW, Adam, SGD, "
                    "...) or leave FSDP strategies out of the sweep (strategies=[...])."
                ) from exc

        # a bound method, as LR schedulers expect to find (they wrap step.__func__)
        optimizer.step = types.MethodType(step_on_shards, optimizer)  # type: ignore[method-assign]  # patched, see above
        # (a flag torch's GradScaler reads, not in torch's types: see refuse_a_loss_scaler)
        optimizer._step_supports_amp_scaling = True  # type: ignore[attr-defined]  # see above

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        self.refuse_unwrap()
        return model

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # full_state_dict + cpu_offload: gathered onto rank 0's CPU memory only; other ranks get {}
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if self.context.rank == 0 else {}


def _fill_shards(model: torch.nn.Module, chunks: dict[str, torch.Tensor], device: torch.device) -> None:
    """The parameters cut while the model was built (see :mod:`optuna_saturn.engines._sharded_build`), which
    ``fully_shard`` sharded on the meta device, get storage on the device with this rank's chunk in it: the same
    rows ``fully_shard`` keeps of a whole parameter (``torch.chunk`` over dim 0). One at a time, each chunk freed
    (and its memory given back to the system) as it is copied, so that the chunks and the shards are never all
    held twice."""
    by_param = {id(p): chunks.pop(n) for n, p in model.named_parameters() if n in chunks}

    def filled(tensor: torch.Tensor) -> torch.Tensor:
        chunk = by_param.pop(id(tensor), None)
        if not tensor.is_meta:
            return tensor
        shard = torch.empty_like(tensor, device=device)
        if chunk is not None:
            with torch.no_grad():
                shard.to_local().copy_(chunk)  # type: ignore[attr-defined]  # a DTensor
        del chunk
        give_back_freed_memory()
        return shard

    model._apply(filled)  # (FSDP re-pads each shard, and points its own state at it)


def is_sharded(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)
