"""Processes that must not outlive the one that started them (Linux: the kernel kills them when it dies)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (a ``kill -9`` of the executor included), so
    that no worker is orphaned. Does nothing where ``prctl`` is missing."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent or parent == 1:  # the parent died before the request took effect
        sys.exit(1)
