"""A cheap analytic lower bound on per-device memory, to skip options that cannot fit before launching anything.

Model state is counted: parameters, gradients and the optimizer's state (the per-parameter tensors of optimizers
known to keep them, such as Adam's two moments; none for others), in the model's dtype, sharded as each strategy
shards it. Activations come on top, so an option this rejects can never fit; an option it accepts may still run
out of memory, which the profile run then reports.
"""

from __future__ import annotations

from typing import Any

from optuna_saturn.strategy import Strategy

#: State tensors of a parameter's size that each optimizer keeps (torch's and DeepSpeed's).
_STATES = {
    "Adam": 2,
    "AdamW": 2,
    "Adamax": 2,
    "NAdam": 2,
    "RAdam": 2,
    "Adadelta": 2,
    "Rprop": 2,
    "Adagrad": 1,
    "ASGD": 1,
    "DeepSpeedCPUAdam": 2,
    "FusedAdam": 2,
    "DeepSpeedCPUAdagrad": 1,
    "FusedLion": 1,
    "DeepSpeedCPULion": 1,
}


def optimizer_states(optimizer: Any) -> int:
    """How many parameter-sized tensors ``optimizer`` keeps per parameter (0 if unknown: a lower bound)."""
    if optimizer is None:
        return 0
    name = type(optimizer).__name__
    defaults = getattr(optimizer, "defaults", {}) or {}
    if name == "SGD":
        return 1 if defaults.get("momentum") else 0
    if name == "RMSprop":
        return 1 + bool(defaults.get("momentum")) + bool(defaults.get("centered"))
    return _STATES.get(name, 0)


def model_state_bytes(
    n_params: int, bytes_per_param: int, strategy: Strategy, devices: int, *, optimizer_states: int = 0
) -> float:
    params = grads = float(n_params * bytes_per_param)
    states = params * optimizer_states
    knobs, config = strategy.knobs, strategy.launcher_config
    if strategy.engine == "fsdp":
        return 0.0 if knobs.get("cpu_offload") else (params + grads + states) / devices
    if strategy.engine == "deepspeed":
        zero = config.get("zero_optimization", {})
        stage = int(zero.get("stage", 0))
        on_device = 0.0 if zero.get("offload_optimizer") else states
        if stage >= 3:
            return 0.0 if zero.get("offload_param") else (params + grads + on_device) / devices
        if stage == 2:
            return params + (grads + on_device) / devices
        return params + grads + (on_device / devices if stage == 1 else on_device)
    return params + grads + states
