"""The soak, short (``benchmarks/soak.py`` is the long one): a few dozen short trials on 2 CPU devices while faults
hit the sweep (``kill -9`` of a worker and of the executor, which is then run again; a second sweep on the same
study; a storage outage), and at the end every trial asked is COMPLETE with its right value, or FAIL with a
reason and its run again COMPLETE; nothing is RUNNING; no params ran twice; and nothing is left behind (process,
thread, descriptor, lease, temporary folder, untold result). Also: a disk under ``log_dir`` that fills up while
trials run ends no worker and no trial."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from support import require

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import soak_faults  # noqa: E402
import soak_sweep  # noqa: E402
from soak_checks import Verdict, check_trials  # noqa: E402
from soak_run import run_soak  # noqa: E402

from optuna_saturn import SaturnExecutor  # noqa: E402
from optuna_saturn.pools import worker_starts  # noqa: E402

SHORT_FAULTS = {"worker", "executor", "second", "outage"}


def _can_mount() -> bool:
    return os.geteuid() == 0


@pytest.mark.launch
@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_short_soak_with_faults_loses_nothing_runs_nothing_twice_and_leaves_nothing(
    saturn_options, tmp_path, monkeypatch, kind
):
    monkeypatch.setenv(soak_sweep.STRATEGIES_ENV, "single,ddp")  # (no DeepSpeed's import: no build lock here)
    result = run_soak(
        soak_faults.FileStorage(kind, tmp_path),
        trials=40,
        seed=0,
        work=tmp_path,
        faults=SHORT_FAULTS,
        seconds=(0.2, 0.5),
        outage=8.0,  # (SQLite waits 5 s for a lock before it fails)
        hang=90.0,
    )
    verdict = result.verdict
    print(f"{kind}: {verdict}; injected {dict(result.injected)}; {result.sweeps} sweeps; {result.wall:.0f} s")
    assert verdict.held, "\n".join(verdict.problems)
    assert {f for f in SHORT_FAULTS if result.injected[f]} == SHORT_FAULTS, (result.injected, result.missed)
    assert verdict.asked == 40 and verdict.complete == 40


def _fill_while_trials_run(study_name: str, storage: str, disk: soak_faults.FullDisk, killed: list) -> None:
    """Once two trials are COMPLETE, fill the disk for 4 s, and kill a worker meanwhile (its host then says so)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            trials = optuna.load_study(study_name=study_name, storage=storage).get_trials(deepcopy=False)
        except Exception:
            trials = []
        if sum(t.state == TrialState.COMPLETE for t in trials) >= 2:
            with disk.full():
                time.sleep(1.0)
                killed.extend(w.pid for w in soak_faults.workers(os.getpid())[:1] if soak_faults.kill_9(w))
                time.sleep(3.0)
            return
        time.sleep(0.1)


@pytest.mark.launch
def test_a_full_disk_under_log_dir_ends_no_worker_and_no_trial(saturn_options, tmp_path, monkeypatch):
    """The pool's own log lines (the host's, a worker's before each job) met the full disk with an error: the
    worker died at its next job (its trial FAIL), the host died telling of a worker's death, and no worker started
    again; the sweep stopped once the workers' start limit passed (a soak saw it). Now only the trial of the worker
    killed here fails, and its run again completes."""
    require(_can_mount(), "root (to mount a tmpfs)", fix="run the tests as root, as CI does")
    monkeypatch.setattr(worker_starts, "WORKER_START_SECONDS", 30.0)  # (a host that died fails the test sooner)
    monkeypatch.setenv(soak_sweep.SECONDS_ENV, "0.2,0.4")
    disk = soak_faults.FullDisk(tmp_path / "runs", size="4m")
    storage = f"sqlite:///{tmp_path / 'study.sqlite3'}"
    study = optuna.create_study(study_name="full", storage=storage, sampler=optuna.samplers.RandomSampler(seed=0))
    killed: list[int] = []
    filler = threading.Thread(target=_fill_while_trials_run, args=("full", storage, disk, killed))
    filler.start()
    try:
        options = {**saturn_options, "log_dir": disk.log_dir, "profile": False, "max_retries": 1}
        SaturnExecutor(devices=2, strategies=["single"], allow_shared_cores=True, **options).optimize(
            study, soak_sweep.objective, n_trials=24
        )
    finally:
        filler.join()
        disk.unmount(tmp_path / "runs-kept")
    assert killed, "no worker was killed while the disk was full"
    verdict = Verdict()
    check_trials(study.get_trials(), verdict)
    assert verdict.held and verdict.asked == verdict.complete == 24, "\n".join(verdict.problems)
    assert verdict.failed_and_retried <= 1  # (the killed worker's trial, if it ran one; no other)


def test_a_log_the_disk_refuses_to_open_is_discarded(tmp_path):
    """(A disk with no inode left refuses to create a file: the worker or the job the log is for still runs.)"""
    from optuna_saturn.worker.log_lines import open_or_discard

    fd = open_or_discard(str(tmp_path / "no such folder" / "worker-0.log"))
    try:
        assert os.write(fd, b"a line nobody keeps\n") == 20
        assert os.path.realpath(f"/proc/self/fd/{fd}") == os.devnull
    finally:
        os.close(fd)
