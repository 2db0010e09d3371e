"""Chaos: faults at random points of real sweeps, and after each one the study must be consistent.

Faults here: ``kill -9`` of the executor at seeded random points (while the pool starts, mid-trial, between
trials, at the end), over ``SATURN_CHAOS_ROUNDS`` rounds (default 3) on one SQLite study. (The kill of one rank,
a rank that hangs, a locked storage: test_checkpoints.py and test_storage_faults.py.) After each round:

- no RUNNING trial lacks a live owner (none is left RUNNING once the next sweep has started);
- every COMPLETE value is present and unchanged;
- each interrupted trial was run again at most ``max_retries`` times;
- no process of the killed sweep remains;
- and at the end the study loads in optuna-dashboard.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from wsgiref.util import setup_testing_defaults

import optuna
import psutil
import pytest
from optuna.trial import TrialState

import objectives
from optuna_saturn import SaturnExecutor

HERE = os.path.dirname(__file__)
ROUNDS = int(os.environ.get("SATURN_CHAOS_ROUNDS", "3"))


def _sweep_killed_after(storage: str, log_dir: str, seconds: float) -> list[psutil.Process]:
    """A sweep of 3 trials in a process of its own, killed with SIGKILL after ``seconds`` (if it still runs);
    returns its processes, to check that none survives."""
    sweep = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "sweep_to_kill.py"), storage, log_dir, "single,ddp", "2", "3"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]),
             "SATURN_TEST_STEP_SLEEP": "0.1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + seconds
    processes = []
    while time.monotonic() < deadline and sweep.poll() is None:
        try:
            processes = [psutil.Process(sweep.pid), *psutil.Process(sweep.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    sweep.send_signal(signal.SIGKILL)
    sweep.wait(timeout=30)
    return processes


def _check(study: optuna.Study, completed: dict[int, float], *, max_retries: int) -> None:
    trials = study.get_trials()
    for trial in trials:
        if trial.state == TrialState.RUNNING:  # the killed sweep's: its owner must be gone by now
            owner = trial.user_attrs["saturn:owner"]
            assert not psutil.pid_exists(owner["pid"]), f"trial {trial.number} is RUNNING under a live sweep"
        assert trial.user_attrs.get("saturn:retries", 0) <= max_retries
    for number, value in completed.items():
        assert trials[number].state == TrialState.COMPLETE and trials[number].value == value
    completed.update({t.number: t.value for t in trials if t.state == TrialState.COMPLETE})


def _loads_in_optuna_dashboard(storage: str, study: optuna.Study) -> None:
    from optuna_dashboard import wsgi

    app = wsgi(storage)
    for path in ("/api/studies", f"/api/studies/{study._study_id}"):
        environ = {"PATH_INFO": path, "REQUEST_METHOD": "GET"}
        setup_testing_defaults(environ)
        status = []
        body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
        assert status[0].startswith("200"), (path, status, body[:500])
        json.loads(body)


@pytest.mark.launch
@pytest.mark.chaos
def test_kill_9_of_the_executor_at_random_points_leaves_a_consistent_study(saturn_options, tmp_path):
    storage = f"sqlite:///{tmp_path / 'chaos.sqlite3'}"
    optuna.create_study(study_name="killed", storage=storage)
    rng = random.Random(0)
    completed: dict[int, float] = {}
    held = 0
    for round_ in range(ROUNDS):
        processes = _sweep_killed_after(storage, str(tmp_path / f"round-{round_}"), rng.uniform(2.0, 14.0))
        gone, alive = psutil.wait_procs(processes, timeout=30)
        assert not alive, f"round {round_}: processes of the killed sweep survive: {alive}"
        _check(optuna.load_study(study_name="killed", storage=storage), completed, max_retries=1)
        held += 1
    study = optuna.load_study(study_name="killed", storage=storage)
    SaturnExecutor(devices=2, strategies=["single", "ddp"], **saturn_options).optimize(
        study, objectives.resumable, n_trials=1)
    trials = study.get_trials()
    assert not [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    _check(study, completed, max_retries=1)
    for trial in trials:
        if trial.state == TrialState.FAIL:
            assert trial.user_attrs["saturn:fail_reason"]
    _loads_in_optuna_dashboard(storage, study)
    print(f"chaos: {ROUNDS} rounds of kill -9, {held} held; {len(trials)} trials: "
          f"{sum(t.state == TrialState.COMPLETE for t in trials)} COMPLETE, "
          f"{sum('saturn:retry_of' in t.user_attrs for t in trials)} run again, "
          f"{sum(t.state == TrialState.FAIL for t in trials)} FAIL")
