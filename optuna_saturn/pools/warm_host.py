"""The pool host: one process that prepares a warm worker once, then forks one per device, and forks another
whenever one exits.

Started by :class:`~optuna_saturn.pools.warm.WorkerPool` as a fork of the executor's process where that is safe
(:mod:`optuna_saturn.pools.forked_host`: torch and the objective's module are then imported already), else as
``python -m optuna_saturn.pools.warm_host CONFIG``; inside the sweep's loopback-only network namespace when network
isolation is on: its workers inherit that one namespace, so they can form process groups with each other, and
nothing they open is reachable from outside.

It imports torch, optuna-saturn and the objective's module, and runs the objective up to its first training loop
with placeholder hyperparameters (so what it imports lazily, transformers' model classes say, is imported too),
once; each worker is then a fork of it, ready in milliseconds, instead of an interpreter that imports it all again.
The host runs one thread and never touches a GPU, so the forks are safe. A worker that exits (recycled after
a failure, an out-of-memory or memory growth, or killed by the executor) is replaced the same way; one that
cannot start is given up on (:mod:`optuna_saturn.pools.worker_starts`: the sweep goes on without its device).
SIGTERM ends the host and its workers; so does the executor's death.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

from optuna_saturn.pools.logs import last_unindented_line
from optuna_saturn.pools.worker_starts import COULD_NOT_START, START_TRIES, give_up
from optuna_saturn.worker.log_lines import open_or_discard, say

#: A worker that dies this soon after its start, by a signal or an error, counts as one that could not start.
_QUICK_EXIT_SECONDS = 5.0


def main(config_path: str) -> None:
    from optuna_saturn.pools.process_identity import started_as
    from optuna_saturn.worker.tied_to_parent import HOST_NAME

    # (orphans of its workers, their data loaders', are reaped by its wait loop below)
    config = started_as(HOST_NAME, config_path)
    config["host_pid"] = os.getpid()  # its workers' parent
    config["memory_baseline"] = _memory_in_use(config)  # before any worker holds a context
    workers: dict[int, tuple[int, float]] = {}  # pid -> (device index, started)

    def stop(signum: int, frame: object) -> None:
        import psutil

        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # and what the workers' objectives forked (orphans it reaped as their subreaper, or still its workers'):
        # nothing of the sweep outlives it
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
        os._exit(0)

    # (first: a fork of the executor inherits its handler, which turns SIGTERM into a KeyboardInterrupt, and the
    # warm-up below ignores what the objective raises; a pool closed while its host prepared waited 10 s for it)
    signal.signal(signal.SIGTERM, stop)
    from optuna_saturn.worker.warm import prepare_process, serve

    objectives = prepare_process(config)
    why_not = _why_not_fork_workers(config)
    if why_not is not None:
        say(f"optuna-saturn: the pool host starts its workers as fresh interpreters: {why_not}.")
        fresh_config = os.path.join(config["folder"], "pool-workers.json")
        with open(os.open(fresh_config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
            json.dump(config, f)
    failed_starts = [0] * len(config["devices"])

    def start(index: int) -> None:
        log = open_or_discard(os.path.join(config["folder"], f"worker-{index}.log"))
        if why_not is not None:
            command = [sys.executable, "-m", "optuna_saturn.pools.warm_host", fresh_config, "--worker", str(index)]
            actions = [(os.POSIX_SPAWN_DUP2, log, 1), (os.POSIX_SPAWN_DUP2, log, 2)]
            pid = os.posix_spawn(sys.executable, command, os.environ, file_actions=actions)
            os.close(log)
            workers[pid] = (index, time.monotonic())
            return
        pid = os.fork()
        if pid == 0:  # the worker
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.close(log)
            try:
                serve(config, index, objectives)  # (exits with its code)
            finally:
                os._exit(1)  # (whatever escaped it: never back into the host's loop)
        os.close(log)
        workers[pid] = (index, time.monotonic())

    for index in range(len(config["devices"])):
        start(index)
    while workers:
        pid, status = os.wait()
        entry = workers.pop(pid, None)
        if entry is None:  # (not a worker: an orphan the host reaped as its subreaper)
            continue
        index, started = entry
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            say(f"optuna-saturn: the worker of device {index} (pid {pid}) exited with code {code}.")
        # A worker that exits before its hello could not start; one that dies by a signal right after its start (a
        # crash in the driver) likely could not either. (A worker replaced after a job exits 0.)
        failed_start = code == COULD_NOT_START or (code != 0 and time.monotonic() - started < _QUICK_EXIT_SECONDS)
        failed_starts[index] = failed_starts[index] + 1 if failed_start else 0
        if failed_starts[index] < START_TRIES:
            start(index)
            continue
        log_name = os.path.join(config["folder"], f"worker-{index}.log")
        why = f"its worker failed to start {START_TRIES} times: {last_unindented_line(Path(log_name))} ({log_name})"
        say(f"optuna-saturn: device {index} is given up on: {why}")
        give_up(config["folder"], index, why)


def fresh_worker(config_path: str, index: int) -> None:
    """A worker started as a fresh interpreter by a host that must not fork (see :func:`_why_not_fork_workers`)."""
    from optuna_saturn.worker.warm import serve

    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    serve(config, index, None)


def _why_not_fork_workers(config: dict) -> str | None:
    """Why this host must not fork its workers, or None. The executor checked itself before forking this host; the
    host has since imported the objective's module and run the objective up to its loop, which may have
    initialised CUDA (``TrainingArguments``, a module-level ``import deepspeed``, ``torch.cuda.is_available()``) or
    started threads: a fork's workers would then die in their first CUDA call, or hang on a lock."""
    from optuna_saturn.devices import Device
    from optuna_saturn.pools.forked_host import why_not_fork

    devices = [Device.from_json(d) for d in config["devices"]]
    return why_not_fork(devices, one_process=bool(config.get("one_process")))


def _memory_in_use(config: dict) -> dict[str, float]:
    """Each GPU's memory in use now, before this pool's workers hold anything on it: a replacement worker waits
    for its GPU to be back near this (see :func:`optuna_saturn.worker.gpu.wait_for_memory_back`)."""
    from optuna_saturn.nvml import used_memory

    used = {entry: used_memory(entry) for entry in config.get("gpus") or ()}
    return {entry: value for entry, value in used.items() if value is not None}


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[2] == "--worker":
        fresh_worker(sys.argv[1], int(sys.argv[3]))
    else:
        main(sys.argv[1])
