"""A cheap analytic lower bound on per-device memory, to skip options that cannot fit before launching anything.

Model state is counted: parameters, gradients and the optimizer's state (the per-parameter tensors of optimizers
known to keep them, such as Adam's two moments; none for others), in the model's dtype, sharded as each strategy's
engine shards it (:meth:`~optuna_saturn.strategy.engine_traits.EngineTraits.state_bytes`). Activations come on
top, so an option this rejects can never fit; an option it accepts may still run out of memory, which the profile
run then reports.
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
    """Bytes of model state on each of ``devices`` devices, sharded (or offloaded) as the strategy's engine says."""
    params = grads = float(n_params * bytes_per_param)
    states = params * optimizer_states
    return strategy.engine_traits.state_bytes(params, grads, states, devices, strategy.knobs, strategy.launcher_config)
