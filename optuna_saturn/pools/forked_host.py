"""The pool host as a fork of the executor's own process, when that is safe.

The executor's process has already imported torch, optuna, optuna-saturn and the objective's module: a host forked
from it starts with all of that, where a fresh interpreter pays it again (2 s here, more on a GPU machine's
loaded file system) before the first trial can start. What is not safe to fork is checked first
(:func:`why_not_fork`), and the pool falls back to a fresh interpreter, saying why in the log:

- **CUDA.** A process that has initialised CUDA, or only loaded its driver (``torch.cuda.is_available()``
  does), cannot use it in a fork: its workers would die in their first CUDA call.
- **Other threads.** A fork keeps only the thread that forks; a lock another thread held at that moment (a
  database driver's, logging's, the import system's) stays held for ever in the child, which then hangs. So the
  executor forks only while no thread but its own (``saturn-*``) runs.
- **OpenMP.** PyTorch's intra-op threads come from an OpenMP runtime (GNU OpenMP here), whose thread pool does
  not survive a fork: a fork of a process that has run a parallel region hangs in its first parallel region of
  its own (a CI run hung there). A warm worker that runs one intra-op thread (a GPU worker, a CPU device of one
  core) never enters one, so it is safe whatever the executor ran before. Where workers may run several threads
  (devices of several cores, or a one-process strategy such as ``threads``, which widens a worker to several
  devices' cores), the executor first releases its OpenMP thread pool (``omp_pause_resource_all``, OpenMP 5.0;
  its next parallel region starts a new one); where no loaded runtime can, the host is a fresh interpreter.

The fork leaves the executor's state alone: it never returns into the executor's code (it ends with ``os._exit``,
so no ``atexit`` handler or finaliser of the executor runs twice), and the executor's sockets (its storage's
database connections, its channel) are pointed at ``/dev/null`` in it, so nothing it does can write to them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from optuna_saturn.devices import Device
from optuna_saturn.pools.launch_commands import network_isolation_prefix
from optuna_saturn.pools.logs import open_log

_logger = logging.getLogger("optuna.saturn.runner")


def why_not_fork(devices: Sequence[Device], *, one_process: bool = False) -> str | None:
    """Why the pool host cannot be a fork of this process (see the module's docstring), or None if it can.
    ``one_process``: the sweep may run one process on the cores of several devices (``threads``). Where workers
    may run several OpenMP threads, this releases the process's OpenMP thread pool: call it right before forking."""
    if not sys.platform.startswith("linux"):
        return "forking the executor is done on Linux only"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "this process has initialised CUDA, which a fork cannot use"
    if any(d.kind == "cuda" for d in devices) and cuda_driver_loaded():
        # torch.cuda.is_available() (the user's script, or devices="auto") initialises the driver without
        # initialising torch's CUDA state: a fork's workers then die in their first CUDA call, with no error.
        return "this process has loaded the CUDA driver (torch.cuda.is_available() does), which a fork cannot use"
    others = [
        t.name
        for t in threading.enumerate()
        if t is not threading.current_thread() and not t.name.startswith("saturn-")
    ]
    if others:
        return (
            f"this process runs other threads ({', '.join(sorted(others)[:3])}), whose locks a fork would keep "
            "locked for ever"
        )
    several_threads = (one_process and sum(len(d.cores) or 1 for d in devices if d.kind == "cpu") > 1) or any(
        d.kind == "cpu" and len(d.cores) > 1 for d in devices
    )
    if several_threads and not release_openmp_threads():
        return (
            "its workers may run several OpenMP threads, and this process's OpenMP runtime cannot release its "
            "thread pool (which a fork cannot use) before the fork"
        )
    return None


def release_openmp_threads() -> bool:
    """Release the thread pool of every OpenMP runtime loaded in this process (``omp_pause_resource_all`` with
    ``omp_pause_hard``), so that a fork can start its own. True when none is loaded, or every one released its
    pool; False when one cannot (a runtime older than OpenMP 5.0)."""
    import ctypes

    maps = Path("/proc/self/maps").read_text(encoding="utf-8", errors="replace")
    runtimes = {line.split()[-1] for line in maps.splitlines() if _OPENMP_RUNTIME.search(line.rsplit("/", 1)[-1])}
    for path in runtimes:
        try:
            pause = ctypes.CDLL(path).omp_pause_resource_all
        except (OSError, AttributeError):
            return False
        pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
        if pause(_OMP_PAUSE_HARD) != 0:
            return False
    return True


#: The shared libraries of GNU, LLVM and Intel OpenMP, under their distributions' names (libgomp-a34b3233.so.1).
_OPENMP_RUNTIME = re.compile(r"^lib(gomp|omp|iomp5)[-.]")
_OMP_PAUSE_HARD = 2  # omp_pause_resource_t: free the threads and everything else the runtime holds


def cuda_driver_loaded() -> bool:
    """Whether the CUDA driver library is mapped into this process (then it may be initialised); True when this
    cannot be told."""
    try:
        return "libcuda.so" in Path("/proc/self/maps").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True


class ForkedHost:
    """A forked pool host, with the part of :class:`subprocess.Popen`'s interface the pool uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    @classmethod
    def start(
        cls, main: str, config_path: str, *, env: Mapping[str, str], log: Path, enter_namespace: bool
    ) -> ForkedHost:
        """Fork; the child sets ``env``, writes to ``log``, enters a loopback-only network namespace if asked,
        and runs ``main(config_path)`` (a ``module:function``) as the host, in a session of its own."""
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            return cls(pid)
        code = 1
        try:
            os.setsid()  # Ctrl-C reaches the executor only; it stops the pool as a whole
            _redirect_output(log)
            _silence_inherited_sockets()
            os.environ.update(env)
            if enter_namespace:
                from optuna_saturn.pools.launch_commands import enter_loopback_only_namespace

                enter_loopback_only_namespace()
            module, function = main.split(":")
            getattr(__import__(module, fromlist=[function]), function)(config_path)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (returncode := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pool host {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        return returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start_host(
    module: str, argument: str, *, env: Mapping[str, str], log: Path, isolate: bool, why_not_fork: str | None
) -> ForkedHost | subprocess.Popen:
    """The process that runs ``module``'s ``main(argument)``: a fork of this one, unless ``why_not_fork`` says why
    not (then a fresh interpreter); in a loopback-only network namespace if ``isolate``."""
    if why_not_fork is None:
        return ForkedHost.start(f"{module}:main", argument, env=env, log=log, enter_namespace=isolate)
    _logger.debug(f"The worker pool's host is a fresh interpreter: {why_not_fork}.")
    command = [sys.executable, "-m", module, argument]
    if isolate:
        command = network_isolation_prefix() + command
    with open_log(log) as out:
        return subprocess.Popen(
            command,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches the executor only; it stops the pool as a whole
        )


def _redirect_output(log: Path) -> None:
    """stdin from /dev/null; stdout and stderr (the descriptors, Python's streams, and logging handlers that wrote
    to the old streams) to ``log``: the executor's streams may be a terminal, or a test runner's capture."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    old = {
        id(sys.stdout): "stdout",
        id(sys.stderr): "stderr",
        id(sys.__stdout__): "stdout",
        id(sys.__stderr__): "stderr",
    }
    streams = {
        # (they live as long as the process: no context manager)
        "stdout": open(1, "w", buffering=1, closefd=False),  # noqa: SIM115
        "stderr": open(2, "w", buffering=1, closefd=False),  # noqa: SIM115
    }
    # (typeshed marks sys.__stdout__ and sys.__stderr__ Final; the forked host replaces them on purpose)
    sys.stdout = sys.__stdout__ = streams["stdout"]  # type: ignore[misc]  # typeshed: Final, see above
    sys.stderr = sys.__stderr__ = streams["stderr"]  # type: ignore[misc]  # typeshed: Final, see above
    loggers = [
        logging.getLogger(),
        *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger)),
    ]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and id(handler.stream) in old:
                handler.setStream(streams[old[id(handler.stream)]])


def _silence_inherited_sockets() -> None:
    """Point every inherited socket at /dev/null: a finaliser in this process can then never talk to the
    executor's database or channel, and the descriptor numbers stay taken (no file of ours can reuse one)."""
    null = os.open(os.devnull, os.O_RDWR)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and fd != null and stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.dup2(null, fd)
        except OSError:
            pass
    os.close(null)
