"""Helpers shared by test modules."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import optuna
import psutil
import pytest

from optuna_saturn import SaturnExecutor


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def require(condition: bool, what: str, *, fix: str = "install it with .ci/install-browser") -> None:
    """Skip when something the test needs is missing, except in CI (CI=true), where that is a failure: CI must
    never pass without having looked."""
    if condition:
        return
    message = f"{what} is missing; {fix}"
    if in_ci():
        pytest.fail(message)
    pytest.skip(message)


def assert_trains_like(reference, result, *, steps: int, rel: float) -> None:
    """The same trial under another strategy: the same loss curve (``steps`` long, and learning) and value."""
    curve = result.user_attrs["curve"]
    assert len(curve) == steps and curve == pytest.approx(reference.user_attrs["curve"], rel=rel)
    assert curve[-1] < curve[0]
    assert result.value == pytest.approx(reference.value, rel=rel)


def kill_a_worker_once(
    storage: str, study_name: str, worker: str, ready: Callable[[optuna.trial.FrozenTrial], bool]
) -> threading.Thread:
    """A thread that kill -9s this process's descendant named ``worker`` (``saturn-worker-<device>``) once the
    study's first trial is ``ready`` (say, it reported a step). Join it after the sweep."""

    def kill() -> None:
        study = optuna.load_study(study_name=study_name, storage=storage)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                trials = study.get_trials(deepcopy=False)
            except Exception:  # (a locked SQLite file: look again, rather than end the killer in silence)
                time.sleep(0.2)
                continue
            if trials and ready(trials[0]):
                for process in psutil.Process().children(recursive=True):
                    try:
                        if process.name() == worker:
                            process.kill()
                            return
                    except psutil.Error:  # (a process that ended while the children were listed)
                        continue
            time.sleep(0.2)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def run_on(
    objective: Callable,
    strategy: str,
    devices: int,
    logs,
    *,
    params: dict | None = None,
    n_trials: int = 1,
    profile: bool = False,
    pruner: optuna.pruners.BasePruner | None = None,
) -> optuna.Study:
    """``n_trials`` of ``objective`` under one strategy on ``devices`` devices (``params`` enqueued for each), each
    launch in a loopback-only network namespace; the study."""
    study = optuna.create_study(pruner=pruner)
    for _ in range(n_trials if params is not None else 0):
        study.enqueue_trial(params)
    SaturnExecutor(
        devices=devices,
        strategies=[strategy],
        isolate_network=True,
        log_dir=logs,
        grace_period=5,
        profile=profile,
        progress=None,
        dashboard=False,
    ).optimize(study, objective, n_trials=n_trials)
    return study
