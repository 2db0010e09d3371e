"""Engines apply a strategy to the user's model, optimizer and data loaders inside each worker.

The launcher only starts processes; the engine is what makes a strategy real (DESIGN decision 3). Each engine is a
small class with one job, looked up by the ``engine`` key of a strategy template.
"""

from __future__ import annotations

import importlib

from optuna_saturn.engines._base import Engine, StrategyMismatch, WorkerContext

#: Each engine's class, imported when a worker first needs it: the executor's own process never applies a
#: strategy, and importing FSDP and DDP costs it a second or more of start-up.
ENGINES: dict[str, str] = {
    "single": "optuna_saturn.engines._single:SingleEngine",
    "ddp": "optuna_saturn.engines._ddp:DDPEngine",
    "fsdp": "optuna_saturn.engines._fsdp:FSDPEngine",
    "deepspeed": "optuna_saturn.engines._deepspeed:DeepSpeedEngine",
}


def engine_class(name: str) -> type[Engine]:
    try:
        module, attribute = ENGINES[name].split(":")
    except KeyError:
        raise ValueError(f"No engine {name!r} in this version; available: {sorted(ENGINES)}.") from None
    engine: type[Engine] = getattr(importlib.import_module(module), attribute)  # (ENGINES names Engine classes)
    return engine


def engine_for(name: str, context: WorkerContext) -> Engine:
    return engine_class(name)(context)


__all__ = ["ENGINES", "Engine", "StrategyMismatch", "WorkerContext", "engine_class", "engine_for"]
