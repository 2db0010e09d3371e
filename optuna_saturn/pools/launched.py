"""Jobs whose launcher must own the processes (a user's template with ``launcher = "deepspeed"`` or
``"accelerate"``): each is a launcher's process tree in its own session, so it can be stopped as a whole.

The launcher starts ``python -m optuna_saturn.worker.launched SPEC`` on each device; every other job runs in the
warm workers. Part of :class:`~optuna_saturn.pools.processes.ProcessPool`, behind the one pool protocol.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from optuna_saturn.devices import Device, pin_cores
from optuna_saturn.pools.launch_commands import build_launch
from optuna_saturn.pools.logs import open_log
from optuna_saturn.pools.protocol import JobEnd
from optuna_saturn.strategy import Strategy

#: Launchers whose processes the warm workers cannot stand in for (they set up the job themselves).
OWN_PROCESSES = ("deepspeed", "accelerate")


def owns_its_processes(strategy: Strategy) -> bool:
    return strategy.launcher in OWN_PROCESSES


def exclusive_mode_conflict(devices: Sequence[Device], strategies: Sequence[Strategy]) -> str | None:
    """Why strategies whose launcher starts the trial's processes cannot run on these GPUs, or None. A GPU in an
    exclusive compute mode takes one process's context: its warm worker holds it, so a launched trial's process
    cannot start there. (Warm workers alone are fine: neither the executor nor the pool host creates a context.)"""
    launched = [s.name for s in strategies if owns_its_processes(s)]
    if not launched or devices[0].kind != "cuda":
        return None
    from optuna_saturn.nvml import exclusive_gpus

    exclusive = exclusive_gpus()
    if not exclusive:
        return None
    return (
        f"GPU(s) {exclusive} are in an exclusive compute mode, where the warm worker's CUDA context leaves no room "
        f"for the processes a launcher starts: {launched} will fail there. Leave them out of strategies=, or set "
        "the compute mode to DEFAULT (nvidia-smi -c DEFAULT)."
    )


@dataclass
class _Launched:
    key: str
    devices: tuple[int, ...]
    process: subprocess.Popen[bytes]


class LaunchedJobs:
    """Starts launches as subprocesses and supervises them; nothing it started outlives :meth:`close`."""

    def __init__(self, devices: Sequence[Device], *, isolate_network: bool, grace_period: float) -> None:
        self._devices = list(devices)
        self._isolate = isolate_network
        self.grace_period = grace_period
        self._running: dict[str, _Launched] = {}

    @property
    def busy(self) -> bool:
        return bool(self._running)

    def submit(self, key: str, spec: dict, devices: Sequence[int], strategy: Strategy, *, log: Path) -> None:
        """Launch the job of ``spec`` on ``devices`` with ``strategy``'s launcher (its spec file is private)."""
        chosen = [self._devices[i] for i in devices]
        spec_path = spec["errors"] + ".json"
        with open(spec_path, "w", encoding="utf-8") as f:
            json.dump({**spec, "devices": [d.to_json() for d in chosen], "pin_cores": pin_cores(self._devices)}, f)
        os.chmod(spec_path, 0o600)
        launch = build_launch(strategy, chosen, spec_path, isolate_network=self._isolate)
        with open_log(log) as out:
            process = subprocess.Popen(
                launch.command,
                env=launch.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches the executor only; it stops each trial as a whole
            )
        self._running[key] = _Launched(key, tuple(devices), process)

    def poll(self) -> list[JobEnd]:
        """Jobs whose launcher has exited since the last call."""
        ends = []
        for launched in list(self._running.values()):
            code = launched.process.poll()
            if code is None:
                continue
            del self._running[launched.key]
            _kill_group(launched.process.pid, signal.SIGKILL)  # stragglers a crashed launcher left behind
            ends.append(JobEnd(launched.key, launched.devices, code == 0, f"exit code {code}"))
        return ends

    def owns(self, key: str) -> bool:
        return key in self._running

    def stop(self, key: str) -> JobEnd | None:
        """Stop one job: SIGTERM to its whole process group, SIGKILL after the grace period."""
        launched = self._running.pop(key, None)
        if launched is None:
            return None
        code = self._stop_processes([launched])[0]
        return JobEnd(key, launched.devices, False, f"stopped (exit code {code})")

    def close(self) -> None:
        launched = list(self._running.values())
        self._running.clear()
        self._stop_processes(launched)

    def _stop_processes(self, launched: list[_Launched]) -> list[int | None]:
        members = {t.key: _group_members(t.process.pid) for t in launched}
        for t in launched:
            _kill_group(t.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_period
        for t in launched:
            with contextlib.suppress(subprocess.TimeoutExpired):
                t.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        for t in launched:
            _kill_group(t.process.pid, signal.SIGKILL)
            for proc in members[t.key]:  # processes that left the group (setsid) are still ours
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            t.process.wait()
        return [t.process.returncode for t in launched]


def _group_members(pid: int) -> list[psutil.Process]:
    try:
        children: list[psutil.Process] = psutil.Process(pid).children(recursive=True)  # (psutil has no types here)
        return children
    except psutil.Error:
        return []


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
