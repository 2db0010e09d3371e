"""Results on their way to the storage: kept on disk until the storage has them, so that no trial's result is lost
when the storage is down longer than the sweep waits for it, or the executor dies while it waits.

A trial's result (its state, values and the sweep's attributes) is written to the sweep's outbox folder before
it is told, and removed once the storage has it. What is left there (the storage never came back; the executor was
killed between the two) is told by the next ``optimize`` on the same study, before anything else, for every trial
that is still RUNNING; it would otherwise be ended FAIL as a dead sweep's orphan and run again.

Storage calls themselves are retried with back-off (:func:`retrying`) on the errors a restarting database or a
locked SQLite file raise (:func:`transient`); other errors (a value the study refuses, a value too long for its
column) are raised at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import optuna
import sqlalchemy.exc

from optuna_saturn.study.interrupts import storage_call
from optuna_saturn.training.checkpoint_paths import make_private_folders

_logger = optuna.logging.get_logger("optuna.saturn")
T = TypeVar("T")


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The transport errors of the optional backends (gRPC proxies, Redis journals), where they are installed."""
    found: list[type[BaseException]] = []
    try:
        import grpc

        found.append(grpc.RpcError)
    except ImportError:
        pass
    try:
        import redis.exceptions

        found += [redis.exceptions.ConnectionError, redis.exceptions.TimeoutError]
    except ImportError:
        pass
    return tuple(found)


#: Errors a storage raises, whether or not it may answer again (:func:`transient` tells). (Optuna's RDB storage
#: wraps every SQLAlchemy error of a commit in StorageInternalError.)
STORAGE_ERRORS: tuple[type[BaseException], ...] = (
    optuna.exceptions.StorageInternalError,
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.TimeoutError,
    OSError,
    *_transport_errors(),
)
_TRANSIENT_CAUSES = (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError, sqlalchemy.exc.TimeoutError)
_GRPC_TRANSIENT = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "UNKNOWN"})


def transient(exc: BaseException) -> bool:
    """Whether the storage may answer ``exc``'s call if asked again: a database restarting or unreachable, a
    locked SQLite file, a journal file on a flaky file system, a gRPC proxy or Redis server that is down. A
    permanent data error (a value too long for MySQL's TEXT column, which Optuna also wraps in
    StorageInternalError) is not: retrying it for minutes would only stop the sweep later."""
    if isinstance(exc, optuna.exceptions.StorageInternalError):
        cause = exc.__cause__ or exc.__context__
        return isinstance(cause, _TRANSIENT_CAUSES) or (cause is not None and transient(cause))
    if isinstance(exc, sqlalchemy.exc.DBAPIError) and not isinstance(exc, _TRANSIENT_CAUSES):
        return bool(exc.connection_invalidated)
    code = getattr(exc, "code", None)
    if callable(code):  # a grpc.RpcError: its status code says whether the server was unreachable
        try:
            return getattr(code(), "name", "") in _GRPC_TRANSIENT
        except Exception:
            return False
    return isinstance(exc, STORAGE_ERRORS)


#: How long a storage call is retried before the sweep gives up on the storage (results stay in the outbox).
RETRY_SECONDS = 120.0
#: A partial result file this old was left by a write that never finished (a kill, a full disk).
_PARTIAL_SECONDS = 3600.0
_FIRST_WAIT, _LONGEST_WAIT = 0.2, 10.0


def retrying(call: Callable[[], T], *, what: str, budget: float | None = None) -> T:
    """``call()``, again after each storage error, waiting twice as long each time (0.2 s up to 10 s), for up to
    ``budget`` seconds (:data:`RETRY_SECONDS`); then the last error is raised."""
    deadline = time.monotonic() + (RETRY_SECONDS if budget is None else budget)
    wait = _FIRST_WAIT
    while True:
        try:
            with storage_call():  # (a Ctrl-C meanwhile waits for the call to return)
                return call()
        except STORAGE_ERRORS as exc:
            if not transient(exc) or time.monotonic() + wait > deadline:
                raise
            cause = exc.__cause__ or exc  # (Optuna wraps the database's own error, which says what happened)
            _logger.warning(
                f"The storage failed to {what} ({type(cause).__name__}: {str(cause).splitlines()[0]}); "
                f"trying again in {wait:.1f} s."
            )
            time.sleep(wait)
            wait = min(2 * wait, _LONGEST_WAIT)


@dataclass(frozen=True)
class Outgoing:
    """A trial's result as the sweep tells it."""

    trial_id: int
    number: int
    state: str  # a TrialState's name
    values: list[float] | None
    attrs: dict[str, Any]


class Outbox:
    """One folder of results not yet in the storage (see the module's docstring)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._said_refused = False

    def keep_if_it_can(self, result: Outgoing) -> Path | None:
        """:meth:`keep`, or None where the disk refuses the write (full, say): the outbox is a fallback, and a
        healthy storage still takes the result, so a full disk under ``log_dir`` never costs one (issue 47, N2).
        Said once per sweep."""
        try:
            return self.keep(result)
        except OSError as exc:
            if not self._said_refused:
                self._said_refused = True
                _logger.warning(
                    f"The disk under {self.folder} refuses the outbox's writes ({exc}): is it full? Results are told "
                    "to the storage without a copy on disk, so one the storage cannot take is lost if this sweep "
                    "dies; a trial whose checkpoint or log cannot be written fails with the reason. Free space "
                    "under log_dir (or give the executor another log_dir). Said once; the sweep goes on."
                )
            return None

    def keep(self, result: Outgoing) -> Path:
        """The result on disk, whole and flushed, in a folder only this user can read or change (its files are
        taken as trusted results at the next start: reliability review, finding 20)."""
        make_private_folders(self.folder)
        path = self.folder / f"trial-{result.number}-{uuid.uuid4().hex[:8]}.json"
        partial = path.with_suffix(".partial")
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as f:
                f.write(json.dumps(asdict(result)))
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            partial.unlink(missing_ok=True)  # (a cut write frees what it took on a full disk)
            raise
        os.replace(partial, path)  # a file that is there is whole
        folder = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)  # (the rename too survives a power loss)
        finally:
            os.close(folder)
        return path

    @staticmethod
    def done(path: Path) -> None:
        path.unlink(missing_ok=True)

    @property
    def late_folder(self) -> Path:
        """Late results: ones the storage refused because someone else had ended their trial. Kept for people to
        read; never told, and never cleared by a recovery."""
        return self.folder / "late"

    def set_aside(self, path: Path) -> Path:
        """Move kept result ``path`` to :attr:`late_folder`."""
        moved = self.late_folder / path.name
        try:
            make_private_folders(self.late_folder)
            os.replace(path, moved)
        except FileNotFoundError:  # (another sweep sharing the folder told or dropped it meanwhile)
            return path
        except OSError:  # (a full disk: the late result stays where it is, and the study keeps it too)
            return path
        return moved

    def pending(self) -> list[tuple[Path, Outgoing]]:
        """The results kept here, this user's and whole. Partial files a killed write left are removed once old;
        an unreadable file is renamed ``*.unreadable`` (said once, kept for a person to read)."""
        if not self.folder.is_dir():
            return []
        for partial in self.folder.glob("trial-*.partial"):
            with contextlib.suppress(OSError):
                if time.time() - partial.stat().st_mtime > _PARTIAL_SECONDS:
                    partial.unlink()
        out = []
        for path in sorted(self.folder.glob("trial-*.json")):
            try:
                if path.stat().st_uid != os.getuid():
                    _logger.warning(f"Ignoring a result file in the outbox that another user owns: {path}.")
                    continue
                out.append((path, Outgoing(**json.loads(path.read_text(encoding="utf-8")))))
            except (OSError, ValueError, TypeError):
                _logger.warning(f"An unreadable result file in the outbox is set aside: {path}.unreadable")
                with contextlib.suppress(OSError):
                    os.replace(path, path.with_name(path.name + ".unreadable"))
        return out
