"""Finding a model's repeated blocks (the layers of a transformer), which both activation checkpointing and
FSDP wrap one by one: per-block granularity is what bounds peak memory to about one block's worth."""

from __future__ import annotations

from functools import partial

import torch


def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every module held in an ``nn.ModuleList`` (GPT-2's ``h``, BERT's ``layer``, ViT's ``blocks``, ...), inner
    ones before the blocks that hold them: T5's ``block[i].layer`` before ``block[i]``, a mixture of experts'
    ``experts`` before their layer. FSDP2 shards children first (a parent sharded first would already manage the
    child's parameters)."""
    blocks: list[torch.nn.Module] = []

    def visit(module: torch.nn.Module) -> None:
        for child in module.children():
            visit(child)
        if isinstance(module, torch.nn.ModuleList):
            blocks.extend(m for m in module if not isinstance(m, torch.nn.ModuleList))

    visit(model)
    return blocks


def outermost_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks that no other repeated block holds: each is recomputed once in backward (checkpointing
    a block inside a checkpointed block would recompute it twice)."""
    blocks = repeated_blocks(model)
    inner = {id(m) for block in blocks for m in block.modules() if m is not block}
    return [block for block in blocks if id(block) not in inner]


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each block's activations in backward instead of storing them."""
    enable = getattr(model, "gradient_checkpointing_enable", None)
    if enable is not None:  # transformers models know their own blocks
        enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    blocks = {id(b) for b in outermost_blocks(model)}
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
