"""Processes that must not outlive the one that started them (Linux: the kernel kills them when it dies)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
#: What ``ps``, ``top`` and psutil's ``name()`` call a warm worker (a fork of the pool host, so its command line
#: is the host's): this prefix and its device index.
WORKER_NAME = "saturn-worker-"
#: ... and the pool host they are forked from (itself a fork of the executor, whose command line it shows, where
#: that is safe).
HOST_NAME = "saturn-host"


def die_with_parent(parent: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (a ``kill -9`` of the executor included), so
    that no worker is orphaned. ``parent``: the parent's pid, as the parent read it before starting this process;
    if the parent died before the request took effect, this process has another parent by now, and exits. (The
    pid alone says nothing: the executor of a container without an init is pid 1.) Does nothing where ``prctl``
    is missing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        sys.exit(1)


def name_process(name: str) -> None:
    """Set this process's name as ``ps -o comm``, ``top`` and psutil's ``name()`` show it (at most 15 bytes)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass
