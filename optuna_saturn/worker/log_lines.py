"""The pool's own lines and logs on a disk that may be full: a full disk under ``log_dir`` must end no process of the
pool (a dead host's workers die with it, and none starts again) and no trial (its result is worth more than its
log)."""

from __future__ import annotations

import contextlib
import os

LOG_MODE = 0o600


def say(line: str) -> None:
    """A line of the pool's own (the host's, a worker's) for its log, if the disk takes it."""
    with contextlib.suppress(OSError):
        print(line, flush=True)


def open_or_discard(path: str) -> int:
    """A descriptor to append to the log at ``path``, or to ``/dev/null`` where the disk refuses even that: the
    process it is for (a worker, a job) runs all the same."""
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, LOG_MODE)
    except OSError:
        return os.open(os.devnull, os.O_WRONLY)
