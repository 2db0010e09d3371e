"""The executor's side of the describer (:mod:`optuna_saturn.pools.describer_host`): the process that runs the
objective to describe trials, so that the executor's own process never runs the user's code (DESIGN decision 18).

It is started with the pool, beside its workers: a fork of the executor where that is safe (torch and the
objective's module are imported already), else a fresh interpreter; inside the sweep's loopback-only network
namespace when network isolation is on. It holds no device: describing never takes one from a trial that is ready
to run. The executor hands it one trial at a time; the description's ``suggest_*`` come back over the channel and
are answered by the real trial, under the study's lock, as a worker's are.

How a description ends, as the pricer sees it:

- a workload: the trial is priced from it;
- ``RuntimeError``: it cannot be described this way (no ``trial.steps()`` loop, an error on the meta device):
  the trial is planned from runtime estimates, and its real run decides;
- ``DescribeTimedOut`` (a ``RuntimeError``): it did not reach its first training loop within ``limit``; the
  trial is planned from runtime estimates and runs, where its start-up limit ends a hang;
- :class:`DescribeFailed`: the objective ended its process or was killed before its first training loop; the
  trial fails with that reason, and nothing of it reached the executor.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna

from optuna_saturn.channel import ChannelServer
from optuna_saturn.clock import WallClock
from optuna_saturn.devices import Device
from optuna_saturn.pools.describer_host import DESCRIPTION_FAILED
from optuna_saturn.pools.forked_host import ForkedHost, start_host, why_not_fork
from optuna_saturn.pools.launch_commands import worker_environment
from optuna_saturn.profiler import DescribeFailed, DescribeTimedOut, NothingToDescribe, Workload
from optuna_saturn.study.trial_session import TrialSession

_logger = optuna.logging.get_logger("optuna.saturn")

#: The default limit of one description: the objective's code before its first training loop (building a
#: tokenizer, reading a data set, building the model on the meta device) may take this long. Past it the trial is
#: not described: it runs, planned from estimates, where its start-up limit ends it if it hangs there too. The
#: sweep waits for each description, so one that hangs must not hold every device idle for long (a review saw a
#: sweep of 4 trials do nothing for 300 s behind one).
DESCRIBE_TIMEOUT_SECONDS = 60.0
#: A description still running this long is said in the log, with how long it may still take.
_SLOW_DESCRIBE_SECONDS = 30.0
#: The describer is started again this many times at most if it dies (it runs no user code itself).
_RESTARTS = 3


class _Order:
    """One trial to describe, and how its description ended (set by the channel's threads)."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.answer: dict[str, Any] | None = None  # what the description said ("described")
        self.ended: dict[str, Any] | None = None  # how its process ended ("done"), or {"died": ...}
        self.taken_at: float | None = None  # when the describer took it (monotonic)
        self.parent_error: Exception | None = None  # what answering one of its requests raised here
        self.done = threading.Event()


class Describer:
    """Starts the describer process and describes trials through it (see the module's docstring). ``describe``
    is called from the sweep loop's thread; the describer's requests come on the channel's threads."""

    def __init__(
        self, devices: Sequence[Device], *, log: Path, isolate_network: bool = False, limit: float = 300.0
    ) -> None:
        self._devices = list(devices)
        self._log = log
        self._isolate = isolate_network
        self.limit = limit
        self._orders: queue.Queue[dict] = queue.Queue()
        self._current: _Order | None = None
        self._process: ForkedHost | subprocess.Popen | None = None
        self._server: ChannelServer | None = None
        self._config_path: Path | None = None
        self._token = ""
        self._ids = itertools.count()
        self._restarts = 0
        self._lock = threading.Lock()

    def start(self, channel: ChannelServer, recipe: dict) -> None:
        """Start the describer; it loads the objective from ``recipe``, as the workers do."""
        self._server = channel
        self._token = channel.register(self._handle)
        self._log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        config = {"channel": channel.address, "token": self._token, "objective": recipe, "executor_pid": os.getpid()}
        self._config_path = Path(channel.folder) / "describer.json"
        self._config_path.write_text(json.dumps(config), encoding="utf-8")
        os.chmod(self._config_path, 0o600)
        self._start_process()

    def _start_process(self) -> None:
        assert self._config_path is not None  # (started)
        kind = self._devices[0].kind if self._devices else "cpu"
        env = {"PYTHONUNBUFFERED": "1", **worker_environment(kind, self._log.parent), "CUDA_VISIBLE_DEVICES": ""}
        self._process = start_host(
            "optuna_saturn.pools.describer_host",
            str(self._config_path),
            env=env,
            log=self._log,
            isolate=self._isolate,
            why_not_fork=why_not_fork(self._devices),
        )

    def close(self) -> None:
        """Stop the describer (and a description it runs: its fork dies with it)."""
        self._orders.put({"exit": True})
        process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)  # (it holds nothing worth a clean exit; its fork's group too)
            process.wait()
        if self._token and self._server is not None:
            self._server.unregister(self._token)
            self._token = ""

    # -- describing (the loop's thread) ---------------------------------------------------------------------------
    def describe(
        self, trial: Any, *, lock: threading.Lock, study: optuna.Study | None = None, still_up: Callable[[], None]
    ) -> Workload:
        """``trial``'s workload, described by the describer; ``trial``: the real ``optuna.Trial`` or a queued trial
        (``study``: the study it is queued in). Raises ``RuntimeError`` where it cannot be described (plan it from
        estimates; ``DescribeTimedOut`` past the limit), :class:`DescribeFailed` where its objective exited or was
        killed (fail it), and what
        answering its requests raised here (a queued trial's parameter that is not fixed). ``still_up`` raises
        if the pool broke meanwhile."""
        server = self._server
        if server is None:
            raise RuntimeError("the describer was not started")
        session = TrialSession(trial, lock, WallClock(), study=study)
        order = _Order(trial.number)
        token = server.register(lambda op, message: self._answer(order, session, op, message))
        try:
            with self._lock:
                self._current = order
            self._orders.put(
                {
                    "id": next(self._ids),
                    "channel": server.address,
                    "token": token,
                    "number": trial.number,
                    "trial": session.snapshot(),
                    "limit": self.limit,
                }
            )
            self._wait(order, still_up)
        finally:
            server.unregister(token)
            with self._lock:
                self._current = None
        return self._outcome(order)

    def _wait(self, order: _Order, still_up: Callable[[], None]) -> None:
        said_slow = False
        while not order.done.wait(0.25):
            still_up()
            process = self._process
            if process is not None and process.poll() is not None:
                self._restart(order)
            taken_at = order.taken_at
            if not said_slow and taken_at is not None and time.monotonic() - taken_at > _SLOW_DESCRIBE_SECONDS:
                said_slow = True
                _logger.warning(
                    f"Describing trial {order.number} (its objective up to its first trial.steps() loop) has taken "
                    f"{_SLOW_DESCRIBE_SECONDS:.0f} s; at {self.limit:.0f} s (describe_timeout) it is given up, and the "
                    "trial runs planned from estimates."
                )

    def _restart(self, order: _Order) -> None:
        """The describer died (it runs no user code: something killed it): started again, a few times."""
        code = self._process.returncode if self._process is not None else None
        if self._restarts >= _RESTARTS:
            order.ended = {"died": f"the describer process exited with code {code}, {_RESTARTS} times"}
            order.done.set()
            return
        self._restarts += 1
        _logger.warning(f"The describer process exited with code {code}; it is started again (log: {self._log}).")
        if order.taken_at is not None:  # (the order it had taken died with it)
            order.ended = {"died": f"the describer process exited with code {code} while describing it"}
            order.done.set()
        self._start_process()

    def _outcome(self, order: _Order) -> Workload:
        if order.parent_error is not None:
            raise order.parent_error
        answer, ended = order.answer or {}, order.ended or {}
        if "workload" in answer:
            return Workload(**answer["workload"])
        if "error" in answer:
            raise (NothingToDescribe if answer.get("nothing_to_describe") else RuntimeError)(answer["error"])
        if "died" in ended:
            raise RuntimeError(ended["died"])
        where = "before its first trial.steps() loop, while it was described"
        if "raised" in answer:  # (KeyboardInterrupt, SystemExit: study.optimize's rules apply to them)
            raise DescribeFailed(f"the objective raised {answer['raised']['text']} {where}", raised=answer["raised"])
        if ended.get("timed_out"):  # (not a fault of the trial: a slow set-up, or a hang its run's limits end)
            raise DescribeTimedOut(
                f"its objective did not reach its first trial.steps() loop within describe_timeout ({self.limit:.0f} "
                "s) while described"
            )
        code = ended.get("exit_code")
        if code == DESCRIPTION_FAILED:  # (not the objective's doing)
            raise RuntimeError(f"describing it failed (the traceback is in {self._log})")
        if isinstance(code, int) and code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
            raise DescribeFailed(f"the objective's process was killed by {name} {where}")
        raise DescribeFailed(f"the objective ended its process with exit code {code} {where}")

    # -- the channel's threads ------------------------------------------------------------------------------------
    def _handle(self, op: str, message: dict) -> Any:
        """The describer's own requests: its next order, and how a description ended."""
        if op == "hello":
            return None
        if op == "next":
            return self._next_order()
        if op == "done":
            with self._lock:
                order = self._current
            if order is not None:
                order.ended = {k: v for k, v in message.items() if k not in ("op", "id")}
                order.done.set()
            return None
        if op == "closed":
            return None  # (the loop's wait sees the process gone, and starts it again)
        raise ValueError(f"Unknown request {op!r} from the describer.")

    def _next_order(self) -> dict:
        while True:
            try:
                order = self._orders.get(timeout=1.0)
            except queue.Empty:
                process = self._process
                if process is None or process.poll() is not None:
                    return {"exit": True}
                continue
            with self._lock:
                if self._current is not None:
                    self._current.taken_at = time.monotonic()
            return order

    @staticmethod
    def _answer(order: _Order, session: TrialSession, op: str, message: dict) -> Any:
        """A description's requests: its suggestions (the real trial answers) and its answer."""
        if op == "described":
            order.answer = {k: v for k, v in message.items() if k != "op"}
            return None
        if op in ("hello", "closed"):
            return session.handle(op, message)
        try:
            return session.handle(op, message)
        except Exception as exc:  # (the description fails with it; so does its describe here, with this error)
            order.parent_error = order.parent_error or exc
            raise
