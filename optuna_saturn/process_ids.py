"""Naming a process so that a later one given its pid is not taken for it: its pid and its start time in clock
ticks since boot (``/proc/<pid>/stat``, field 22), which no later process with the same pid shares and no clock
step changes; within one boot and one PID namespace, where a pid means one process.
"""

from __future__ import annotations

import os


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot; None if it is gone (or not readable)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[-1].split()
        return int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def boot_id() -> str:
    """The kernel's boot id ("" where unreadable): after a reboot, pids and start ticks mean other processes."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def pid_namespace() -> str:
    """This process's PID namespace, ``"pid:[<inode>]"`` ("" where unreadable): in another one (a container),
    pids mean other processes."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """Whether ``pid`` names a live process (a zombie, exited but not yet reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False
