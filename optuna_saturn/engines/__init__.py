"""Engines apply a strategy to the user's model, optimizer and data loaders inside each worker.

The launcher only starts processes; the engine is what makes a strategy real (DESIGN decision 3). Each engine is a
small class with one job, looked up by the ``engine`` key of a strategy template in the one registry of engines
(:mod:`optuna_saturn.strategy.engine_registry`: the package's own and those of other installed distributions), where
its traits (:class:`EngineTraits`) name its class. What the rest of the package needs to know of an engine is in its
traits, so that nothing outside a worker imports an engine.
"""

from __future__ import annotations

import importlib

from optuna_saturn.engines._base import Engine, StrategyMismatch, WorkerContext
from optuna_saturn.strategy.builtin_engines import DDPTraits, DeepSpeedTraits, FSDPTraits, SingleTraits
from optuna_saturn.strategy.engine_registry import BUILTIN_ENGINES, ENTRY_POINT_GROUP, engine_names, traits_of
from optuna_saturn.strategy.engine_traits import EngineTraits, Knob


def engine_class(name: str) -> type[Engine]:
    """The engine class of the engine called ``name``, imported now (in a worker: the executor's own process never
    applies a strategy, and importing FSDP costs it a second)."""
    traits = traits_of(name)
    module, attribute = traits.engine.split(":")
    engine = getattr(importlib.import_module(module), attribute, None)
    if not (isinstance(engine, type) and issubclass(engine, Engine)):
        raise TypeError(f"The engine {name!r} names {traits.engine!r}, which is not a subclass of Engine.")
    if engine.checkpoint_format != traits.checkpoint_format:
        raise TypeError(
            f"The engine {name!r}: its class saves checkpoints as {engine.checkpoint_format!r} and its traits say "
            f"{traits.checkpoint_format!r}; set the class's checkpoint_format from its traits."
        )
    return engine


def engine_for(name: str, context: WorkerContext) -> Engine:
    return engine_class(name)(context)


def __getattr__(attribute: str) -> type[Engine]:
    """The package's own engine classes by their names (``from optuna_saturn.engines import DDPEngine``, for an
    engine that extends one), imported when first asked for."""
    for name in BUILTIN_ENGINES:
        if traits_of(name).engine.endswith(f":{attribute}"):
            return engine_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


__all__ = [
    "ENTRY_POINT_GROUP",
    "DDPTraits",
    "DeepSpeedTraits",
    "Engine",
    "EngineTraits",
    "FSDPTraits",
    "Knob",
    "SingleTraits",
    "StrategyMismatch",
    "WorkerContext",
    "engine_class",
    "engine_for",
    "engine_names",
    "traits_of",
]
