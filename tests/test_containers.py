"""A sweep whose executor is PID 1 of its PID namespace: a container's entrypoint without an init, Docker's and
Kubernetes' default. It runs its trials (its pool host once took a parent of PID 1 for a dead parent, and exited
before running any), and a ``kill -9`` of it leaves no process behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import optuna
import psutil
import pytest
from optuna.trial import TrialState
from support import require

HERE = os.path.dirname(__file__)
pytestmark = pytest.mark.launch


def _as_pid_1(storage: str, log_dir: str, n_trials: int, **env: str) -> subprocess.Popen:
    """``sweep_to_kill.py`` as PID 1 of a new PID namespace (``unshare --pid --fork --mount-proc``)."""
    require(
        os.geteuid() == 0 and shutil.which("unshare") is not None,
        "root and unshare (util-linux)",
        fix="run the tests as root, as CI does",
    )
    command = [
        "unshare",
        "--pid",
        "--fork",
        "--mount-proc",
        "--",
        sys.executable,
        os.path.join(HERE, "sweep_to_kill.py"),
        storage,
        log_dir,
        "single",
        "2",
        str(n_trials),
    ]
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]), **env},
    )


def test_a_sweep_whose_executor_is_pid_1_runs_its_trials(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.sqlite3'}"
    optuna.create_study(study_name="killed", storage=storage)
    sweep = _as_pid_1(storage, str(tmp_path / "runs"), 2)
    output, _ = sweep.communicate(timeout=300)
    assert sweep.returncode == 0, output
    assert "executor pid 1\n" in output
    trials = optuna.load_study(study_name="killed", storage=storage).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2, output


def test_a_kill_9_of_a_pid_1_executor_leaves_no_process(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.sqlite3'}"
    optuna.create_study(study_name="killed", storage=storage)
    sweep = _as_pid_1(storage, str(tmp_path / "runs"), 1, SATURN_TEST_HANG_AT="20")
    try:
        deadline = time.monotonic() + 180
        while True:  # until the trial runs (it reports, then hangs at step 20)
            assert sweep.poll() is None and time.monotonic() < deadline, "the trial did not start"
            trials = optuna.load_study(study_name="killed", storage=storage).trials
            if trials and trials[0].intermediate_values:
                break
            time.sleep(0.2)
        (executor,) = psutil.Process(sweep.pid).children()
        descendants = executor.children(recursive=True)
        assert any(p.name().startswith("saturn-worker-") for p in descendants), [p.name() for p in descendants]
        executor.send_signal(signal.SIGKILL)
    finally:
        for process in psutil.Process(sweep.pid).children():  # (unshare's child: the namespace's PID 1)
            process.kill()
        sweep.communicate(timeout=30)
    _, alive = psutil.wait_procs(descendants, timeout=30)
    assert not alive, f"outlived their executor: {[(p.pid, p.name()) for p in alive]}"
