"""Gradient clipping written for one process keeps working under every strategy.

Users clip with ``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`` between the backward pass and
``optimizer.step()``. Under DeepSpeed ZeRO the gradients live in the ZeRO optimizer's partitions, not in
``param.grad``, so that call would silently clip nothing; under FSDP2 the norm it returns is a sharded DTensor.
Workers therefore install this module's versions of ``clip_grad_norm_`` and ``clip_grad_value_`` (before the
objective's module is imported, so ``from torch.nn.utils import clip_grad_norm_`` gets them too). Gradients of a
prepared model whose engine keeps them its own way are clipped by that engine; any other call is torch's own.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.utils
import torch.nn.utils.clip_grad


class ClipsGradients(Protocol):
    """An engine that keeps its gradients its own way (DeepSpeed's ZeRO partitions) and so clips them itself."""

    def clip_grad_norm(
        self, model: torch.nn.Module, parameters: list[Any], max_norm: float, norm_type: float, **kwargs: Any
    ) -> torch.Tensor: ...


original_clip_grad_norm = torch.nn.utils.clip_grad.clip_grad_norm_
original_clip_grad_value = torch.nn.utils.clip_grad.clip_grad_value_

#: id(parameter) -> (the engine that owns its gradients, the prepared model), for this trial's models.
_owners: dict[int, tuple[ClipsGradients, torch.nn.Module]] = {}


def install() -> None:
    """Route torch's clipping functions through this module (idempotent)."""
    torch.nn.utils.clip_grad_norm_ = clip_grad_norm_
    torch.nn.utils.clip_grad_value_ = clip_grad_value_
    torch.nn.utils.clip_grad.clip_grad_norm_ = clip_grad_norm_
    torch.nn.utils.clip_grad.clip_grad_value_ = clip_grad_value_


def register(engine: ClipsGradients, model: torch.nn.Module, parameters: list[torch.nn.Parameter]) -> None:
    """Clipping these parameters' gradients is ``engine``'s job."""
    for p in parameters:
        _owners[id(p)] = (engine, model)


def forget_all() -> None:
    """A new run in this process: the previous run's models are gone (their ids may be reused)."""
    _owners.clear()


def _owner(parameters: list[torch.Tensor]) -> tuple[ClipsGradients, torch.nn.Module] | None:
    owners = {id(_owners[id(p)][0]): _owners[id(p)] for p in parameters if id(p) in _owners}
    if len(owners) > 1:
        raise ValueError("clip_grad_norm_ got the parameters of several prepared models; clip each model alone.")
    return next(iter(owners.values()), None)


def clip_grad_norm_(
    parameters: torch.Tensor | Any,
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> torch.Tensor:
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    owner = _owner(params)
    if owner is not None:
        engine, model = owner
        return engine.clip_grad_norm(
            model, params, float(max_norm), float(norm_type), error_if_nonfinite=error_if_nonfinite, foreach=foreach
        )
    total = original_clip_grad_norm(params, max_norm, norm_type, error_if_nonfinite=error_if_nonfinite, foreach=foreach)
    full_tensor = getattr(total, "full_tensor", None)  # FSDP2: the norm over every rank's shards, as a tensor
    return full_tensor() if full_tensor is not None else total


def clip_grad_value_(parameters: torch.Tensor | Any, clip_value: float, foreach: bool | None = None) -> None:
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    if _owner(params) is not None:
        raise ValueError(
            "clip_grad_value_ cannot reach the gradients under DeepSpeed ZeRO (they live in the ZeRO optimizer's "
            "partitions). Clip by norm with torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm), which "
            "DeepSpeed applies, or leave DeepSpeed strategies out of this sweep (strategies=[...])."
        )
    original_clip_grad_value(params, clip_value, foreach=foreach)
