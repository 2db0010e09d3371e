"""Whether a DeepSpeed op's build lock is held by a live build, or was left by a dead one.

PyTorch's builder (``torch.utils.cpp_extension``) takes the op folder's ``lock`` file, a ``FileBaton``, every time
a process loads the op, built or not, and waits for ever while the file exists. The file holds no pid, but the
baton keeps it open from the moment it makes it (``os.open(O_CREAT | O_EXCL)``) until it removes it: a lock that no
process on this machine has open was left by a process that died (a trial stopped during a build, a ``kill -9``).
One so young that its holder may be between closing and removing it is left alone, and so is one whose holder
cannot be told (another user's processes hide their files); those are judged by their age alone, as a build on
another machine sharing the folder (a home on NFS) must be: older than any build takes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

#: A build lock older than this was left by a killed build (one takes 1-2 min, 5 on a busy machine).
STALE_LOCK_SECONDS = 15 * 60
#: A lock no process holds is left alone this long: its holder may be between closing and removing it.
UNHELD_GRACE_SECONDS = 10.0
#: The lock files of a build: PyTorch's FileBaton, and ninja's own.
LOCK_NAMES = ("lock", ".ninja_lock")
#: Where the processes of this machine are listed (a test points it at a fake one).
PROC = "/proc"


def held(path: Path) -> bool | None:
    """Whether a process on this machine has ``path`` open; None where that cannot be told (a process of the
    file's owner whose open files this one may not read)."""
    try:
        target, owner = os.path.realpath(path), path.stat().st_uid
    except FileNotFoundError:
        return False
    unknown = False
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        try:
            links = [os.readlink(fd.path) for fd in os.scandir(f"{entry.path}/fd")]
        except FileNotFoundError:  # (it ended)
            continue
        except PermissionError:
            unknown = unknown or _owner(entry.path) == owner
            continue
        except OSError:  # (an fd closed while read)
            continue
        if target in links:
            return True
    return None if unknown else False


def _owner(process: str) -> int | None:
    try:
        return os.stat(process).st_uid
    except FileNotFoundError:
        return None


def stale(path: Path, now: float | None = None) -> bool:
    """Whether no build can still hold the lock at ``path``: older than any build takes, or, past a short grace,
    held by no process on this machine."""
    try:
        age = (time.time() if now is None else now) - path.stat().st_mtime
    except FileNotFoundError:
        return False
    return age > STALE_LOCK_SECONDS or (age > UNHELD_GRACE_SECONDS and held(path) is False)


def building(folders: list[Path], ops: list[str]) -> list[Path]:
    """The locks of ``ops`` in the extensions ``folders`` that a live build holds now (its trial's ranks build or
    wait for it: not a stall)."""
    now, found = time.time(), []
    for lock in (Path(f) / op / name for f in folders for op in ops for name in LOCK_NAMES):
        try:
            young = now - lock.stat().st_mtime <= STALE_LOCK_SECONDS  # (an older one excuses nothing: hung)
        except FileNotFoundError:
            continue
        if young and held(lock) is not False:
            found.append(lock)
    return found
