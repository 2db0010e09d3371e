"""Finding a model's repeated blocks (the layers of a transformer), which both activation checkpointing and
FSDP wrap one by one: per-block granularity is what bounds peak memory to about one block's worth."""

from __future__ import annotations

from functools import partial

import torch


def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every module held in an ``nn.ModuleList`` (GPT-2's ``h``, BERT's ``layer``, ViT's ``blocks``, ...)."""
    return [block for module in model.modules() if isinstance(module, torch.nn.ModuleList) for block in module]


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each block's activations in backward instead of storing them."""
    if hasattr(model, "gradient_checkpointing_enable"):  # transformers models know their own blocks
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    blocks = {id(b) for b in repeated_blocks(model)}
    if not blocks:
        raise ValueError(
            "Activation checkpointing found no repeated blocks (modules in an nn.ModuleList) to checkpoint. "
            "Use a strategy without '-ckpt' for this model."
        )
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda m: id(m) in blocks,
    )
