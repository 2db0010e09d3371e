"""Runners start and supervise the processes that run jobs. They are the only part of optuna-saturn that starts
processes: the warm worker pool (one worker per device, :mod:`optuna_saturn.runner.pool`), and launchers for
strategies whose launcher must own the processes (:mod:`optuna_saturn.runner.local`)."""

from optuna_saturn.runner.launch import build_launch
from optuna_saturn.runner.local import LaunchedTrial, LocalRunner
from optuna_saturn.runner.pool import JobEnd, WorkerPool

__all__ = ["JobEnd", "LaunchedTrial", "LocalRunner", "WorkerPool", "build_launch"]
