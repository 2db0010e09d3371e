"""DeepSpeed's op builds on a machine shared by environments and sweeps (issue 47): the extensions cache is keyed by
what builds the op, a stale build lock is removed op built or not, and a build is never taken for a stall.

Seen on a busy machine: two environments shared one unkeyed cache, each rebuilt the other's op inside a trial, the
trial was stopped as a stall 1 s before its build ended, its lock stayed, and its retry waited on it until it too
was stopped. No real op is built here (that takes about 2 min): fake lock files and op folders stand in."""

from __future__ import annotations

import importlib.metadata
import os
import sys
import time
from pathlib import Path

import pytest
import torch
from test_policies import running, state_of

from optuna_saturn.devices import Device
from optuna_saturn.planner import Option
from optuna_saturn.pools import build_locks, deepspeed_ops
from optuna_saturn.pools.launch_commands import (
    build_key,
    build_launch,
    extensions_cache,
    extensions_folder,
    worker_environment,
)
from optuna_saturn.strategy import load_strategies
from optuna_saturn.sweep.faults import Faults
from optuna_saturn.sweep.settings import SweepSettings

CPUS = [Device("cpu", 0, (0,)), Device("cpu", 1, (1,))]


@pytest.fixture(autouse=True)
def _fresh_key(monkeypatch):
    """The key is worked out once per process; these tests change what it is made of."""
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    build_key.cache_clear()
    yield
    build_key.cache_clear()


def _aged(path: Path, seconds: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


# -- 1. the cache is keyed by what builds the op ------------------------------------------------------------------
def test_the_extensions_cache_is_keyed_by_python_torch_deepspeed_the_device_kind_and_the_environment(
    monkeypatch, tmp_path
):
    cpu = extensions_cache("cpu")
    assert cpu.parent == Path.home() / ".cache" / "optuna-saturn" / "torch_extensions"
    for part in (sys.implementation.cache_tag, torch.__version__, importlib.metadata.version("deepspeed"), "-cpu"):
        assert part in cpu.name
    assert extensions_cache("cuda") != cpu  # (a CPU and a GPU build of cpu_adam share its name)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    build_key.cache_clear()
    assert "-cuda12.8" in extensions_cache("cuda").name and "cuda12.8" not in extensions_cache("cpu").name
    # what the workers and launched trials use
    assert worker_environment("cpu", tmp_path)["TORCH_EXTENSIONS_DIR"] == str(cpu)
    assert build_launch(load_strategies()["zero2"], CPUS, "/tmp/s.json").env["TORCH_EXTENSIONS_DIR"] == str(cpu)
    # another environment: other versions, or the same versions elsewhere (the build files name its paths)
    monkeypatch.setattr(sys, "prefix", "/opt/another-env")
    build_key.cache_clear()
    elsewhere = extensions_cache("cpu")
    monkeypatch.setattr(torch, "__version__", "2.99.0+cpu")
    build_key.cache_clear()
    assert len({cpu, elsewhere, extensions_cache("cpu")}) == 3


def test_a_users_torch_extensions_dir_wins_everywhere_the_cache_is_used(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "mine"))
    assert extensions_folder("cpu") == extensions_folder("cuda") == str(tmp_path / "mine")
    assert worker_environment("cpu", tmp_path)["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "mine")
    launch = build_launch(load_strategies()["zero2"], CPUS, "/tmp/s.json")
    assert launch.env["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "mine")


# -- 2. a stale lock is removed whenever it is stale, op built or not ---------------------------------------------
def test_a_stale_lock_beside_a_built_op_is_removed_before_the_pool_starts(tmp_path, monkeypatch, caplog):
    """The repro (stale_build_lock.py): the op built, a 20-minute-old lock beside it; every process that loads the
    op takes that lock first, so every ZeRO trial waited on it until stopped as a stall."""
    folder = tmp_path / "extensions"
    (folder / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").parent.mkdir(parents=True)
    (folder / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").write_bytes(b"")
    lock = _aged(folder / "deepspeed_shm_comm" / "lock", 20 * 60)
    monkeypatch.setattr(deepspeed_ops, "build_command", lambda builders: pytest.fail("the op is built"))
    with caplog.at_level("WARNING", logger="optuna.saturn.runner"):
        deepspeed_ops.build_missing("cpu", {"TORCH_EXTENSIONS_DIR": str(folder)}, log=tmp_path / "ops.log")
    assert not lock.exists() and f"Removed {lock}" in caplog.text


def test_a_lock_no_process_holds_is_stale_past_a_short_grace_and_one_a_process_holds_is_kept(tmp_path, monkeypatch):
    """torch's FileBaton holds no pid, but keeps its lock file open until it removes it: a lock no process on the
    machine has open was left by a dead one. The machine's processes are a fake /proc here."""
    proc = tmp_path / "proc"
    monkeypatch.setattr(build_locks, "PROC", str(proc))
    lock = _aged(tmp_path / "ext" / "deepspeed_shm_comm" / "lock", 60)
    holder = proc / "4242" / "fd"
    holder.mkdir(parents=True)
    (holder / "0").symlink_to("/dev/null")
    (holder / "3").symlink_to(os.path.realpath(lock))
    assert build_locks.held(lock) is True and not build_locks.stale(lock)  # a live build: kept
    (holder / "3").unlink()
    assert build_locks.held(lock) is False and build_locks.stale(lock)  # its holder died
    deepspeed_ops.remove_stale_locks("cpu", tmp_path / "ext")
    assert not lock.exists()
    young = _aged(lock, 2)  # (its holder may be between closing and removing it)
    assert not build_locks.stale(young)
    assert build_locks.stale(_aged(lock, build_locks.STALE_LOCK_SECONDS + 60))  # older than any build
    _aged(lock, 60)
    hidden = proc / "99" / "fd"  # a process of the lock's owner whose files cannot be read: nothing can be told
    hidden.mkdir(parents=True)
    (hidden / "3").symlink_to("/dev/null")
    readlink = os.readlink

    def refused(path, *args, **kwargs):
        if str(path).startswith(str(hidden)):
            raise PermissionError(path)
        return readlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "readlink", refused)
    assert build_locks.held(lock) is None and not build_locks.stale(lock)


def test_a_lock_this_process_holds_open_is_held(tmp_path):
    """The same check on the real /proc: a baton's open file is seen."""
    lock = tmp_path / "lock"
    fd = os.open(lock, os.O_CREAT | os.O_EXCL)
    try:
        assert build_locks.held(lock) is True
    finally:
        os.close(fd)
    assert build_locks.held(lock) is not True


# -- 3. a build is never counted as a stall ------------------------------------------------------------------------
def test_a_trial_silent_while_an_op_builds_is_not_stalled_and_its_silence_counts_from_the_builds_end():
    state = state_of(1)
    since = [0.0]
    faults = Faults(stall_timeout=30.0, max_retries=1, may_leave_out=True, since_build=lambda: since[0])
    run = running(state, Option("single", 1, 10.0), (0,))
    run.session.last_progress_at = 5.0
    assert faults.stalled(state, 40.0) == []  # 35 s silent, a build under way
    since[0] = 10.0
    assert faults.stalled(state, 40.0) == []  # the build ended 10 s ago
    since[0] = 31.0
    [stop] = faults.stalled(state, 40.0)
    assert stop.run is run and "no progress for 35 s" in stop.reason


def test_a_zero_sweep_sees_the_builds_in_its_extensions_folder_and_another_sweep_does_not(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    strategies = load_strategies()
    state = state_of(2)
    zero = Faults.for_sweep(
        SweepSettings(state.devices, [strategies["zero2"]], "list", 1.0, tmp_path, stall_timeout=30.0),
        may_leave_out=False,
        taken_over=set,
    )
    ddp = Faults.for_sweep(
        SweepSettings(state.devices, [strategies["ddp"]], "list", 1.0, tmp_path, stall_timeout=30.0),
        may_leave_out=False,
        taken_over=set,
    )
    run = running(state, Option("zero2", 2, 10.0), (0, 1))
    run.session.last_progress_at = 5.0
    lock = _aged(tmp_path / "deepspeed_shm_comm" / "lock", 60)
    fd = os.open(lock, os.O_RDONLY)  # (a build holds it)
    try:
        assert deepspeed_ops.seconds_since_a_build() == 0.0
        assert zero.stalled(state, 40.0) == []
        assert len(ddp.stalled(state, 40.0)) == 1  # (no DeepSpeed strategy: no build of its own to wait for)
    finally:
        os.close(fd)
    lock.unlink()
    _aged(tmp_path / "deepspeed_shm_comm" / "deepspeed_shm_comm.so", 5)  # the build ended 5 s ago
    assert zero.stalled(state, 40.0) == []
    _aged(tmp_path / "deepspeed_shm_comm" / "deepspeed_shm_comm.so", 300)
    assert len(zero.stalled(state, 40.0)) == 1
