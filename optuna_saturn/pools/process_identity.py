"""Telling a process apart from a later one that got its pid, before signalling it.

Why: a worker that died is reaped by the pool host at once, and its pid can be given to an unrelated process of
the same user within moments; a ``kill`` of the recorded pid would then hit that process (reliability review,
finding 21). A process is named by its pid and its start time (:mod:`optuna_saturn.process_ids`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

from optuna_saturn.process_ids import alive, start_ticks

__all__ = ["alive", "become_subreaper", "kill_if_same", "start_ticks", "started_as"]


def kill_if_same(pid: int, ticks: int | None) -> None:
    """SIGKILL ``pid`` only if it is still the process that started at ``ticks`` (None: not known, so any)."""
    if ticks is not None and start_ticks(pid) != ticks:
        return  # (gone, and its pid reused or free)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def become_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans (Linux ``PR_SET_CHILD_SUBREAPER``): the data
    loader workers of a worker that was killed are then reaped by the pool host's wait loop, not left as zombies
    of PID 1, which in a container may be the executor, and reaps no one. False where the kernel refuses."""
    try:
        result: int = ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        return result == 0
    except (OSError, AttributeError):
        return False


def started_as(name: str, config_path: str) -> dict:
    """A process of the pool's first moves (the pool host, the describer): its config read, tied to the executor
    (it dies with it), named as ``ps`` shows it, and the reaper of its descendants' orphans."""
    import json

    from optuna_saturn.worker.tied_to_parent import die_with_parent, name_process

    with open(config_path, encoding="utf-8") as f:
        config: dict = json.load(f)
    die_with_parent(config["executor_pid"])
    name_process(name)
    become_subreaper()
    return config
