"""Runners start and supervise trial processes. They are the only part of optuna-saturn that starts processes."""

from optuna_saturn.runner.launch import build_launch
from optuna_saturn.runner.local import LaunchedTrial, LocalRunner

__all__ = ["LaunchedTrial", "LocalRunner", "build_launch"]
