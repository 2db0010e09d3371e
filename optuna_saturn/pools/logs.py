"""The sweep's log files: readable by their user alone (a trial's output may hold its data, its errors the
storage's address), in folders of the same."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

LOG_MODE = 0o600


def private_folder(path: str) -> None:
    """Create ``path`` for this user alone, or check that it is: a folder, not a link, this user's, and
    unreadable to others (a folder another user made first, under ``/tmp`` say, could feed the sweep files)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(
            f"{path} must be a folder of this user's that no one else can read or write (it is "
            f"{oct(info.st_mode & 0o7777)}, owned by uid {info.st_uid}); remove it and run again."
        )


def tail(path: Path, limit: int = 1024 * 1024) -> str:
    """The last ``limit`` bytes of a log (all of it if it is shorter), as text; "" if there is none."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - limit))
            text = f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return (
        f"[... the first {size - limit} bytes of this log were left on the node ...]\n" + text if size > limit else text
    )


def open_log(path: Path) -> BinaryIO:
    """``path`` opened to append to, created readable by this user alone (its folder too)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return open(path, "ab", opener=lambda name, flags: os.open(name, flags, LOG_MODE))


def last_unindented_line(log: Path) -> str:
    """The last line a process wrote that is not indented: a traceback's exception (or, for a process killed from
    outside, just its last message)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip() and not line[0].isspace()), "")
