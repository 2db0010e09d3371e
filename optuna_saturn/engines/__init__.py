"""Engines apply a strategy to the user's model, optimizer and data loaders inside each worker.

The launcher only starts processes; the engine is what makes a strategy real (DESIGN decision 3). Each engine is a
small class with one job, looked up by the ``engine`` key of a strategy template.
"""

from __future__ import annotations

from optuna_saturn.engines._base import Engine, StrategyMismatch, WorkerContext
from optuna_saturn.engines._ddp import DDPEngine
from optuna_saturn.engines._deepspeed import DeepSpeedEngine
from optuna_saturn.engines._fsdp import FSDPEngine
from optuna_saturn.engines._single import SingleEngine

ENGINES: dict[str, type[Engine]] = {
    "single": SingleEngine, "ddp": DDPEngine, "fsdp": FSDPEngine, "deepspeed": DeepSpeedEngine,
}


def engine_for(name: str, context: WorkerContext) -> Engine:
    try:
        return ENGINES[name](context)
    except KeyError:
        raise ValueError(f"No engine {name!r} in this version; available: {sorted(ENGINES)}.") from None


__all__ = ["ENGINES", "Engine", "StrategyMismatch", "WorkerContext", "engine_for"]
