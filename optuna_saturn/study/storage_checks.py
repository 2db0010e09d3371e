"""Storages whose guarantees a sweep relies on, checked before anything runs: what cannot be shared between the
sweep's threads, or between sweeps, is refused with the reason and the fix; what may be unsafe is said.

What a sweep relies on: every thread (the heartbeat, the workers' requests) sees one database, and a trial's
move out of the queue or to its end is made by one process only (:mod:`optuna_saturn.study.moves`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from optuna.storages import BaseStorage, RDBStorage

_logger = optuna.logging.get_logger("optuna.saturn")

#: File systems whose locks SQLite cannot trust (SQLite's own documentation: "SQLite over a network"): a move made
#: by one host is not seen as taken by another, or every write fails.
NETWORK_FILE_SYSTEMS = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "beegfs", "gpfs", "ceph", "glusterfs", "fuse.sshfs"}
)


def refuse_lost_guarantees(storage: BaseStorage) -> None:
    """Raise ValueError for a storage the sweep cannot share: an in-memory SQLite URL (each thread sees its own
    empty database), or a SQLite file on a network file system. Warn about a gRPC proxy, which is only as safe as
    the storage behind it (reliability review, finding 12)."""
    rdb: Any = getattr(storage, "_backend", storage)  # (Optuna wraps an RDB storage in a cache)
    if isinstance(rdb, RDBStorage) and rdb.url.startswith("sqlite"):
        database = sqlalchemy.engine.make_url(rdb.url).database
        if not database or database == ":memory:" or database.startswith("file::memory:"):
            raise ValueError(
                f"The study's storage {rdb.url!r} is an in-memory SQLite database, which each thread of the sweep "
                "sees empty. Use a file (sqlite:///sweep.sqlite3), or Optuna's in-memory storage "
                "(optuna.create_study() without a storage)."
            )
        file_system = file_system_of(Path(database))
        if file_system in NETWORK_FILE_SYSTEMS:
            raise ValueError(
                f"The study's SQLite file {database} is on a network file system ({file_system}), where SQLite's "
                "locks are unsafe: two sweeps could take one trial, or every write fail. Put the file on a local "
                "disk, or use a database server (postgresql://...) for sweeps on several machines."
            )
    elif type(storage).__name__ == "GrpcStorageProxy":
        _logger.warning(
            "The study's storage is a gRPC proxy: a sweep is only as safe as the storage behind the proxy's server. "
            "Over PostgreSQL or MySQL, every move is made once; over a SQLite file, two sweeps may take one trial."
        )


def file_system_of(path: Path) -> str:
    """The type of the file system ``path`` lies on (from ``/proc/self/mounts``); "" where it cannot be told."""
    try:
        resolved = os.path.realpath(path.parent if not path.exists() else path)
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return ""
    best, kind = "", ""
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind
