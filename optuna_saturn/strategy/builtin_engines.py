"""The traits of the engines the package ships (see :mod:`optuna_saturn.strategy.engine_traits`): an engine from
another distribution subclasses one of these, or :class:`EngineTraits` itself."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from optuna_saturn.strategy.engine_traits import (
    ACTIVATION_CHECKPOINTING,
    CPU_OFFLOAD,
    DEEPSPEED,
    EngineTraits,
    Knob,
    SavedCheckpoint,
)

#: The knobs of an engine that can recompute each block's activations in backward.
RECOMPUTING: Mapping[str, Knob] = {**EngineTraits.knobs, "activation_checkpointing": ACTIVATION_CHECKPOINTING}


class SingleTraits(EngineTraits):
    """One process on one device (or on the cores of several CPU devices: ``one_process``)."""

    engine = "optuna_saturn.engines._single:SingleEngine"
    knobs = RECOMPUTING
    runs_one_process = True


class DDPTraits(EngineTraits):
    """A full replica of the model, its gradients and its optimizer state on every device."""

    engine = "optuna_saturn.engines._ddp:DDPEngine"


class FSDPTraits(EngineTraits):
    """Parameters, gradients and optimizer state sharded over the devices, or all of them in host memory."""

    engine = "optuna_saturn.engines._fsdp:FSDPEngine"
    knobs: ClassVar[Mapping[str, Knob]] = {**RECOMPUTING, "cpu_offload": CPU_OFFLOAD}

    def state_bytes(
        self, params: float, grads: float, states: float, devices: int, knobs: Mapping, config: Mapping
    ) -> float:
        return 0.0 if knobs.get("cpu_offload") else (params + grads + states) / devices

    def trades_compute_for_memory(self, knobs: Mapping, config: Mapping) -> bool:
        return bool(knobs.get("activation_checkpointing") or knobs.get("cpu_offload"))


class DeepSpeedTraits(EngineTraits):
    """ZeRO: stage 1 shards the optimizer state, 2 the gradients too, 3 the parameters too; each may be offloaded
    to host memory (``launcher_config.zero_optimization``)."""

    engine = "optuna_saturn.engines._deepspeed:DeepSpeedEngine"
    checkpoint_format = DEEPSPEED
    knobs = RECOMPUTING
    libraries = ("deepspeed",)
    builds_ops = True

    def knob_problem(self, key: str, value: Any) -> str | None:
        if key == "cpu_offload":
            return (
                "knobs.cpu_offload applies to engine 'fsdp' only; for DeepSpeed set "
                "launcher_config.zero_optimization.offload_optimizer / offload_param."
            )
        return super().knob_problem(key, value)

    def state_bytes(
        self, params: float, grads: float, states: float, devices: int, knobs: Mapping, config: Mapping
    ) -> float:
        zero = config.get("zero_optimization", {})
        stage = int(zero.get("stage", 0))
        on_device = 0.0 if zero.get("offload_optimizer") else states
        if stage >= 3:
            return 0.0 if zero.get("offload_param") else (params + grads + on_device) / devices
        if stage == 2:
            return params + (grads + on_device) / devices
        return params + grads + (on_device / devices if stage == 1 else on_device)

    def trades_compute_for_memory(self, knobs: Mapping, config: Mapping) -> bool:
        zero = config.get("zero_optimization", {})
        offloads = any(
            str(zero.get(part, {}).get("device", "none")) != "none" for part in ("offload_optimizer", "offload_param")
        )
        return offloads or super().trades_compute_for_memory(knobs, config)

    def can_resume(self, saved: SavedCheckpoint, world_size: int, strategy: str | None = None) -> bool:
        """Its optimizer partitions belong to the world size that wrote them: a run on as many ranks loads them as
        they are, and a run of the same strategy (the same ZeRO stage) on any number of ranks loads them through
        DeepSpeed's universal checkpoint."""
        return saved.format == self.checkpoint_format and (saved.world_size == world_size or strategy == saved.strategy)


#: The package's own engines by name (the registry's first entries: a new one is its class above and a line here).
BUILTIN_TRAITS: dict[str, type[EngineTraits]] = {
    "single": SingleTraits,
    "ddp": DDPTraits,
    "fsdp": FSDPTraits,
    "deepspeed": DeepSpeedTraits,
}
