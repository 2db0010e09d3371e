"""Local runner: each trial is a process tree in its own session, so it can be stopped as a whole."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from optuna_saturn.runner.launch import Launch


@dataclass
class LaunchedTrial:
    key: Any
    process: subprocess.Popen
    log_path: Path
    started_at: float = field(default_factory=time.time)


class LocalRunner:
    """Starts launches as subprocesses and supervises them; nothing it started outlives :meth:`stop_all`."""

    def __init__(self, *, grace_period: float = 10.0) -> None:
        self.grace_period = grace_period
        self._running: dict[Any, LaunchedTrial] = {}

    def launch(self, key: Any, launch: Launch, log_path: Path) -> LaunchedTrial:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                launch.command, env=launch.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches the executor only; it stops each trial as a whole
            )
        launched = LaunchedTrial(key, process, log_path)
        self._running[key] = launched
        return launched

    def poll(self) -> list[tuple[LaunchedTrial, int]]:
        """Trials whose launcher has exited since the last call, with its exit code."""
        ended = [(t, t.process.poll()) for t in self._running.values()]
        ended = [(t, code) for t, code in ended if code is not None]
        for t, _ in ended:
            del self._running[t.key]
            self._kill_group(t.process.pid, signal.SIGKILL)  # stragglers a crashed launcher left behind
        return ended

    @property
    def running(self) -> list[LaunchedTrial]:
        return list(self._running.values())

    def stop(self, key: Any) -> int | None:
        """Stop one trial: SIGTERM to its whole process group, SIGKILL after the grace period."""
        launched = self._running.pop(key, None)
        if launched is None:
            return None
        return self._stop_processes([launched])[0]

    def stop_all(self) -> None:
        launched = list(self._running.values())
        self._running.clear()
        self._stop_processes(launched)

    def _stop_processes(self, launched: list[LaunchedTrial]) -> list[int | None]:
        members = {t.key: self._group_members(t.process.pid) for t in launched}
        for t in launched:
            self._kill_group(t.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_period
        for t in launched:
            try:
                t.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for t in launched:
            self._kill_group(t.process.pid, signal.SIGKILL)
            for proc in members[t.key]:  # processes that left the group (setsid) are still ours
                try:
                    proc.kill()
                except psutil.Error:
                    pass
            t.process.wait()
        return [t.process.returncode for t in launched]

    @staticmethod
    def _group_members(pid: int) -> list[psutil.Process]:
        try:
            return psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            return []

    @staticmethod
    def _kill_group(pid: int, sig: int) -> None:
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
