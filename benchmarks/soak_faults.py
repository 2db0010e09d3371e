"""The faults of the soak (``benchmarks/soak.py``), each made as it happens in the field:

- a storage outage: PostgreSQL's server stopped, then started again on the same port; a SQLite file locked by
  another process (``BEGIN EXCLUSIVE``: every read and write waits, then fails); a journal made unreachable by
  renaming its folder away (root passes any permission, so a chmod would not stop the sweeps). A SQLite file is
  not renamed away: a commit whose rollback journal is then deleted under another name fails, and the next
  connection plays the journal back, undoing a write the retry took for done (SQLite's "How To Corrupt": a hot
  journal parted from its database), which cost a trial its params in a first try of this soak;
- a full disk under ``log_dir``: a small tmpfs mounted there, filled to the last byte, then emptied;
- ``kill -9`` of the executor, of a worker, of a rank: found in the executor's process tree;
- a stale DeepSpeed build lock: PyTorch's empty ``lock`` file, 20 minutes old, held by no process, in the
  extensions folder the sweep's workers use.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil


class FileStorage:
    """A SQLite file, which an outage locks, or an Optuna journal, in a folder that an outage renames away."""

    def __init__(self, kind: str, work: Path) -> None:
        self.kind = kind
        self.folder = work / "storage"
        self.folder.mkdir(parents=True)
        path = self.folder / ("study.sqlite3" if kind == "sqlite" else "journal.log")
        self.spec = f"sqlite:///{path}" if kind == "sqlite" else f"journal:{path}"

    def outage(self, seconds: float) -> None:
        if self.kind == "sqlite":
            self._locked(seconds)
            return
        away = self.folder.with_name(self.folder.name + "-away")
        os.rename(self.folder, away)
        try:
            time.sleep(seconds)
        finally:
            os.rename(away, self.folder)

    def _locked(self, seconds: float) -> None:
        connection = sqlite3.connect(self.spec.removeprefix("sqlite:///"), timeout=60, isolation_level=None)
        try:
            connection.execute("BEGIN EXCLUSIVE")  # (once the writer of the moment is done)
            time.sleep(seconds)
            connection.execute("ROLLBACK")
        finally:
            connection.close()

    def close(self) -> None:
        pass


class PostgresStorage:
    """A database on a PostgreSQL server on 127.0.0.1 (``tests/postgres.py``), whose outage stops the server."""

    kind = "postgres"

    def __init__(self, server, name: str) -> None:
        self.server = server
        self.spec = server.create_database(name)

    def outage(self, seconds: float) -> None:
        port = self.server.port
        self.server.stop()
        try:
            time.sleep(seconds)
        finally:
            self.server.start()
        if self.server.port != port:  # (tests/postgres.py takes another port if its own was taken meanwhile)
            raise RuntimeError(f"PostgreSQL came back on port {self.server.port}, not {port}: the soak is void")

    def close(self) -> None:
        pass


class FullDisk:
    """A tmpfs of ``size`` mounted at ``log_dir`` for the whole soak, which :meth:`fill` fills for a while."""

    def __init__(self, log_dir: Path, size: str = "256m") -> None:
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            raise SystemExit("the full-disk fault mounts a tmpfs: run as root, or leave it out (--faults)")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(log_dir)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"mount -t tmpfs at {log_dir} failed ({done.stderr.strip()}): leave out disk (--faults)")

    def fill(self, seconds: float) -> int:
        """Fill the disk for ``seconds``; returns the bytes it took."""
        with self.full() as taken:
            time.sleep(seconds)
        return taken

    @contextlib.contextmanager
    def full(self) -> Iterator[int]:
        """The disk full to its last byte while in the block (yields the bytes that took)."""
        filler = self.log_dir / ".soak-filler"
        taken = 0
        with open(filler, "wb", buffering=0) as f:  # (unbuffered: nothing left to write at its close)
            for chunk in (1 << 20, 1 << 12, 1):
                try:
                    while True:
                        taken += f.write(b"\0" * chunk) or 0
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
        try:
            yield taken
        finally:
            filler.unlink()

    def unmount(self, keep: Path) -> None:
        """Copy what the sweeps wrote to ``keep`` (for the logs), then unmount."""
        shutil.copytree(self.log_dir, keep, symlinks=True, dirs_exist_ok=True)
        subprocess.run(["umount", str(self.log_dir)], check=True)


# -- processes --------------------------------------------------------------------------------------------------------
def workers(executor_pid: int) -> list[psutil.Process]:
    """The executor's warm workers (each runs a trial, or a rank of one), by the name the pool gives them."""
    from optuna_saturn.worker.tied_to_parent import WORKER_NAME

    try:
        tree = psutil.Process(executor_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for p in tree:
        try:
            if p.name().startswith(WORKER_NAME):
                found.append(p)
        except psutil.NoSuchProcess:
            continue
    return sorted(found, key=lambda p: p.pid)


def kill_9(process: psutil.Process) -> bool:
    try:
        process.send_signal(signal.SIGKILL)
        return True
    except psutil.NoSuchProcess:
        return False


def marked(mark: str) -> list[psutil.Process]:
    """Live processes whose environment carries the soak's ``SOAK_RUN=mark`` (every process the soak started,
    and theirs), other than this one."""
    found = []
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        try:
            if p.environ().get("SOAK_RUN") == mark and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            continue
    return found


# -- the build lock ---------------------------------------------------------------------------------------------------
def extensions_copy(work: Path) -> Path:
    """An extensions folder of the soak's own (its workers' ``TORCH_EXTENSIONS_DIR``): a copy of this machine's,
    so that the soak's stale lock stops no other sweep on the machine and no op is built."""
    from optuna_saturn.pools.launch_commands import extensions_folder

    folder = work / "torch_extensions"
    mine = Path(extensions_folder("cpu"))
    if mine.is_dir():
        shutil.copytree(mine, folder, symlinks=True)
    else:
        folder.mkdir()
    return folder


def plant_stale_lock(extensions: Path) -> Path:
    """What a build killed mid-way leaves: PyTorch's FileBaton, an empty file named ``lock``, 20 minutes old."""
    lock = extensions / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.touch()
    old = time.time() - 1200
    os.utime(lock, (old, old))
    return lock
