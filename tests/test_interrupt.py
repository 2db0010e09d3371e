from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import optuna
import psutil
import pytest
from optuna.trial import TrialState

from optuna_saturn.worker.tied_to_parent import WORKER_NAME

pytestmark = pytest.mark.launch
HERE = os.path.dirname(__file__)


def _is_worker(process: psutil.Process) -> bool:
    try:
        # a warm worker is a fork of the pool host (named after its device); a launched one runs _worker
        return process.name().startswith(WORKER_NAME) or "optuna_saturn.worker.launched" in " ".join(process.cmdline())
    except psutil.Error:  # exited (or a zombie) while we looked
        return False


def _workers(process: psutil.Process) -> list[psutil.Process]:
    return [p for p in process.children(recursive=True) if _is_worker(p)]


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _running_trials(storage: str) -> list:
    try:
        return optuna.load_study(study_name="interrupted", storage=storage).get_trials(states=(TrialState.RUNNING,))
    except Exception:  # (not created yet, or the file locked for a moment)
        return []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_stops_every_process_and_ends_every_trial(saturn_options, tmp_path, signum):
    storage = f"sqlite:///{tmp_path / 'study.sqlite3'}"
    sweep = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "sweep_to_interrupt.py"), storage, str(tmp_path / "runs")],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])},
    )
    parent = psutil.Process(sweep.pid)
    deadline = time.monotonic() + 60
    while len(_workers(parent)) < 2:
        assert sweep.poll() is None, "the sweep exited before its trials started"
        assert time.monotonic() < deadline, "trials did not start within 60 s"
        time.sleep(0.2)
    while len(_running_trials(storage)) < 2:  # (both trials started: each is RUNNING in the study)
        assert sweep.poll() is None, "the sweep exited before its trials started"
        assert time.monotonic() < deadline, "trials did not start within 60 s"
        time.sleep(0.2)
    descendants = parent.children(recursive=True)
    sweep.send_signal(signum)
    sweep.wait(timeout=60)

    assert sweep.returncode != 0
    alive = [p for p in descendants if _alive(p)]
    assert alive == [], [p.pid for p in alive]
    trials = optuna.load_study(study_name="interrupted", storage=storage).trials
    stopped = [t for t in trials if t.state == TrialState.FAIL]
    assert len(stopped) == 2 and {t.number for t in stopped} == {0, 1}
    if signum == signal.SIGINT:  # (you stopped it: as study.optimize, nothing runs again)
        assert len(trials) == 2
        assert all("interrupted" in t.system_attrs["saturn:fail_reason"] for t in stopped)
    else:  # (SLURM's time limit, a pre-emption: each stopped trial waits in the queue for the next optimize)
        assert all("terminated" in t.system_attrs["saturn:fail_reason"] for t in stopped)
        again = [t for t in trials if t.state == TrialState.WAITING]
        assert sorted(t.user_attrs["saturn:retry_of"] for t in again) == [0, 1]
        by_retried = sorted(again, key=lambda t: t.user_attrs["saturn:retry_of"])
        assert [t.system_attrs["fixed_params"] for t in by_retried] == [t.params for t in stopped]


def test_a_stop_signal_waits_for_the_storage_call_under_way():
    """Raised inside a storage call, a KeyboardInterrupt can leave a SQLite transaction open, and the stopping
    sweep's own writes then wait on "database is locked" (a CI run hung 60 s on it): the signal is raised when the
    call returns, and at once outside one."""
    from optuna_saturn.study.interrupts import stop_signal, storage_call

    previous = signal.signal(signal.SIGTERM, stop_signal)
    finished = []
    try:
        with pytest.raises(KeyboardInterrupt, match="signal 15"), storage_call():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the handler runs meanwhile, and the call goes on
            finished.append(True)
        assert finished == [True]
        with pytest.raises(KeyboardInterrupt, match="signal 15"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1.0)
    finally:
        signal.signal(signal.SIGTERM, previous)
