"""optuna-saturn: run an Optuna sweep of large models on a pool of devices, choosing each trial's parallelism
strategy, device count and start jointly (the SPASE problem, after Saturn)."""

from optuna_saturn.devices import Device
from optuna_saturn.executor import SaturnExecutor
from optuna_saturn.strategy import Strategy, StrategyError, load_strategies
from optuna_saturn.trial import SaturnTrial

__version__ = "0.1.0"

__all__ = ["Device", "SaturnExecutor", "SaturnTrial", "Strategy", "StrategyError", "__version__", "load_strategies"]
