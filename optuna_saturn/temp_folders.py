"""A sweep's private folder in the temporary directory (the channel's socket, the pool's config, rendezvous and
error files), and the removal of the folders whose executor is gone.

Why: an executor that is killed (``kill -9``, the out-of-memory killer, ``os._exit`` in user code) runs no
cleanup, and every one left its ``optuna-saturn-XXXXXXXX`` folder for good (16 in one day on a shared machine).
Each folder now says who owns it (``owner.json``: the pid, its start in clock ticks since boot, the boot and the
PID namespace), and every sweep removes, at its start, this user's folders whose owner is gone: judged by pid AND
start time, so a pid given to a later process does not keep a folder, and a live sweep's is never removed. A
folder whose owner cannot be judged (no ``owner.json`` yet, or an earlier version's; another PID namespace's) is
left alone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import stat
import tempfile

from optuna_saturn.process_ids import alive, boot_id, pid_namespace, start_ticks

_logger = logging.getLogger("optuna.saturn")

PREFIX = "optuna-saturn-"
OWNER_FILE = "owner.json"
#: What :func:`tempfile.mkdtemp` names a sweep's folder: never the leases' folder, a simulation's or a Ray actor's.
_NAME = re.compile(re.escape(PREFIX) + r"[a-z0-9_]{8}")


def make_sweep_folder() -> str:
    """A fresh 0700 folder of this process's sweep in the temporary directory, with its owner written in it."""
    folder = tempfile.mkdtemp(prefix=PREFIX)
    os.chmod(folder, 0o700)
    pid = os.getpid()
    owner = {"pid": pid, "ticks": start_ticks(pid), "boot": boot_id(), "pid_namespace": pid_namespace()}
    partial = os.path.join(folder, OWNER_FILE + ".partial")
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(owner, f)
    os.replace(partial, os.path.join(folder, OWNER_FILE))  # (whole or absent: a half-written one is no owner)
    return folder


def remove_dead_sweeps_folders(parent: str | None = None) -> list[str]:
    """Remove this user's sweep folders in ``parent`` (the temporary directory) whose executor is gone; returns
    the folders removed."""
    parent = parent if parent is not None else tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return []
    for entry in entries:
        if not _NAME.fullmatch(entry.name):
            continue
        with contextlib.suppress(OSError):
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and owner_gone(entry.path):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
    if removed:
        _logger.info(f"Removed {len(removed)} temporary folder(s) of sweeps whose executor is gone: {removed}.")
    return removed


def owner_gone(folder: str) -> bool:
    """Whether the process that made ``folder`` is gone for sure; False where that cannot be told."""
    try:
        with open(os.path.join(folder, OWNER_FILE), encoding="utf-8") as f:
            owner = json.load(f)
        pid, ticks, boot, namespace = int(owner["pid"]), owner["ticks"], str(owner["boot"]), owner["pid_namespace"]
    except (OSError, ValueError, TypeError, KeyError):
        return False  # (being made now, or by an earlier version: whose, unknown)
    if boot and boot_id() and boot != boot_id():
        return True  # (made before the machine restarted)
    if not namespace or namespace != pid_namespace():
        return False  # (its pid means another process here)
    if not alive(pid):
        return True
    return ticks is not None and start_ticks(pid) != ticks  # (its pid was given to a later process)
