"""Ctrl-C and SIGTERM stop a sweep between storage calls, never inside one.

Python raises ``KeyboardInterrupt`` at whatever bytecode the main thread is running when the signal comes. Landing
inside a storage call (in SQLAlchemy's commit or in the closing of its session) it can leave a connection checked
out with its transaction open; on SQLite that holds the file's write lock, so every later write of the stopping
sweep (its trials' FAIL states, its last heartbeat) waits on "database is locked" until the retries give up. So
while a sweep runs, the signals are taken by :func:`stop_signal`: outside a storage call it raises at once, as
before; inside one (:func:`storage_call`, which :func:`~optuna_saturn.study.outbox.retrying` wraps around every
attempt) it is kept, and raised as soon as the call returns.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

_depth = 0  # storage calls under way in the main thread (signals are handled there)
_pending: int | None = None  # the signal kept while a storage call was under way


class Terminated(KeyboardInterrupt):
    """SIGTERM: what ended the sweep is the machine's scheduler, not you (SLURM at the job's time limit, a
    pre-emption, a node drained), so the trials it stopped run again: the next ``optimize`` on the study runs them.
    A ``KeyboardInterrupt``, so that ``optimize`` raises it as Ctrl-C's."""


def _interrupt(signum: int) -> KeyboardInterrupt:
    reason = f"signal {signum}"
    return Terminated(reason) if signum == signal.SIGTERM else KeyboardInterrupt(reason)


@contextlib.contextmanager
def storage_call() -> Iterator[None]:
    """Around one storage call: a stop signal that comes meanwhile is raised when it returns."""
    global _depth, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _pending is not None:
            signum, _pending = _pending, None
            raise _interrupt(signum)


#: Around a step that must not be cut in two (a trial's end: told, then its retry queued), for the same reason.
signals_held = storage_call


def stop_signal(signum: int, frame: FrameType | None) -> None:
    """The handler of SIGINT and SIGTERM while a sweep runs."""
    global _pending
    if _depth > 0:
        _pending = signum
        return
    raise _interrupt(signum)


class sigterm_as_keyboard_interrupt:
    """Treat SIGTERM like Ctrl-C while a sweep runs, so a killed sweep still stops its trials cleanly (as
    :class:`Terminated`: they run again next time); either one waits for a storage call under way
    (:mod:`optuna_saturn.study.interrupts`)."""

    def __enter__(self) -> None:
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                if signum == signal.SIGTERM or signal.getsignal(signum) is signal.default_int_handler:
                    self._previous[signum] = signal.signal(signum, stop_signal)

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
