"""optuna-saturn: run an Optuna sweep of large models on a pool of devices, choosing each trial's parallelism
strategy, device count and start jointly (the SPASE problem, after Saturn).

The public names are imported on first use: the command line (``optuna-saturn --help``) and the worker processes
start without importing torch, DeepSpeed or the solvers until they need them."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Each public name, and the module that defines it.
_EXPORTS = {
    "Device": "optuna_saturn.devices",
    "SaturnExecutor": "optuna_saturn.executor",
    "SaturnTrial": "optuna_saturn.trial",
    "Strategy": "optuna_saturn.strategy",
    "StrategyError": "optuna_saturn.strategy",
    "load_strategies": "optuna_saturn.strategy",
}

if TYPE_CHECKING:
    from optuna_saturn.devices import Device
    from optuna_saturn.executor import SaturnExecutor
    from optuna_saturn.strategy import Strategy, StrategyError, load_strategies
    from optuna_saturn.trial import SaturnTrial

__all__ = ["Device", "SaturnExecutor", "SaturnTrial", "Strategy", "StrategyError", "__version__", "load_strategies"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'optuna_saturn' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # (once: later lookups find it directly)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
