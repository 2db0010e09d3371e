"""Devices whose worker cannot start: given up on, so that the sweep plans without them instead of waiting for
ever on a job that needs them, and ends with the reason when no device is left.

A worker fails to start when it exits before saying hello to the pool (its GPU cannot be bound, CUDA cannot
create a context, the objective's module cannot be imported there), or when it does not say hello within
:data:`WORKER_START_SECONDS` (a driver call that hangs). The pool host restarts a worker that failed to start
(the fault may be passing: memory a killed predecessor held) and gives up after :data:`START_TRIES` failures in a
row; it says so to the executor's pool through a marker file in the pool's folder, which :class:`StartWatch` reads.
The pool's own clock covers the worker that hangs, which the host cannot tell from a slow import.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import optuna

from optuna_saturn.worker.warm import COULD_NOT_START

__all__ = ["COULD_NOT_START", "START_TRIES", "WORKER_START_SECONDS", "StartWatch", "give_up"]

#: A worker that has not said hello this long after it was started (or after its predecessor died) is given up on.
WORKER_START_SECONDS = 300.0

_logger = optuna.logging.get_logger("optuna.saturn.runner")
#: Failed starts in a row after which the host starts no worker on the device again.
START_TRIES = 3


def _marker(folder: str | os.PathLike, index: int) -> Path:
    return Path(folder) / f"given-up-{index}"


def give_up(folder: str | os.PathLike, index: int, reason: str) -> None:
    """(The host.) No worker starts on device ``index`` again; ``reason`` says why, for the sweep's message."""
    _marker(folder, index).write_text(reason, encoding="utf-8")


class StartWatch:
    """(The executor's pool, from its start.) Which devices' workers are given up on, and why: by the host (its
    marker), or here, for a worker down longer than ``timeout``. Once given up, a device stays given up."""

    def __init__(
        self, folder: Path, count: int, *, timeout: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._folder, self._clock = folder, clock
        self._timeout = WORKER_START_SECONDS if timeout is None else timeout
        for index in range(count):  # (a marker an earlier pool left in the same folder)
            _marker(folder, index).unlink(missing_ok=True)
        self._down_since: dict[int, float] = dict.fromkeys(range(count), clock())
        self.given_up: dict[int, str] = {}

    def up(self, index: int) -> None:
        self._down_since.pop(index, None)

    def down(self, index: int) -> None:
        self._down_since.setdefault(index, self._clock())

    def lost(self) -> dict[int, str]:
        """Every device given up on so far, with the reason."""
        now = self._clock()
        for index, since in list(self._down_since.items()):
            if index in self.given_up:
                continue
            marker = _marker(self._folder, index)
            if marker.exists():
                self.given_up[index] = marker.read_text(encoding="utf-8", errors="replace").strip()
            elif now - since > self._timeout:
                self.given_up[index] = (
                    f"its worker did not start within {self._timeout:.0f} s (its log: "
                    f"{self._folder / f'worker-{index}.log'})"
                )
            else:
                continue
            _logger.warning(f"Device {index} is given up on: {self.given_up[index]}")
        return dict(self.given_up)

    def why_none_started(self) -> str:
        """Why no device is left, in a line: the first device's reason in full, the others' count."""
        first, *others = sorted(self.given_up)
        also = f"; devices {', '.join(map(str, others))} were given up on too (their logs say why)" if others else ""
        return f"no device's worker could start. Device {first}: {self.given_up[first]}{also}"
