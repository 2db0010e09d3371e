"""A cheap analytic lower bound on per-device memory, to skip options that cannot fit before launching anything.

Only model state is counted (parameters and gradients, in the model's dtype), sharded as each strategy shards it.
Optimizer state and activations come on top, so an option this rejects can never fit; an option it accepts may
still run out of memory, which the profile run then reports.
"""

from __future__ import annotations

from optuna_saturn.strategy import Strategy


def model_state_bytes(n_params: int, bytes_per_param: int, strategy: Strategy, devices: int) -> float:
    params = grads = float(n_params * bytes_per_param)
    knobs, config = strategy.knobs, strategy.launcher_config
    if strategy.engine == "fsdp":
        return 0.0 if knobs.get("cpu_offload") else (params + grads) / devices
    if strategy.engine == "deepspeed":
        zero = config.get("zero_optimization", {})
        stage = int(zero.get("stage", 0))
        if stage >= 3:
            return 0.0 if zero.get("offload_param") else (params + grads) / devices
        return params + (grads / devices if stage == 2 else grads)
    return params + grads
