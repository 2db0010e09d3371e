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
a failure, an out-of-memory or memory growth, or killed by the executor) is replaced the same way; one that keeps
dying right after it starts is given up on (its log says why; the executor reports it). SIGTERM ends the host and
its workers; so does the executor's death.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time

#: A worker that exits this soon after starting, this many times in a row, is not started again.
_QUICK_EXIT_SECONDS = 5.0
_QUICK_EXITS = 3


def main(config_path: str) -> None:
    from optuna_saturn.worker.tied_to_parent import HOST_NAME, die_with_parent, name_process

    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    die_with_parent(config["executor_pid"])
    name_process(HOST_NAME)
    config["host_pid"] = os.getpid()  # its workers' parent
    from optuna_saturn.worker.warm import prepare_process, serve

    objectives = prepare_process(config)
    workers: dict[int, tuple[int, float]] = {}  # pid -> (device index, started)
    quick_exits = [0] * len(config["devices"])

    def start(index: int) -> None:
        pid = os.fork()
        if pid == 0:  # the worker
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            log = os.open(
                os.path.join(config["folder"], f"worker-{index}.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600
            )
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.close(log)
            try:
                serve(config, index, objectives)
            finally:
                os._exit(0)
        workers[pid] = (index, time.monotonic())

    def stop(signum: int, frame: object) -> None:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    for index in range(len(config["devices"])):
        start(index)
    while workers:
        pid, _ = os.wait()
        index, started = workers.pop(pid, (None, 0.0))
        if index is None:
            continue
        quick_exits[index] = quick_exits[index] + 1 if time.monotonic() - started < _QUICK_EXIT_SECONDS else 0
        if quick_exits[index] < _QUICK_EXITS:
            start(index)


if __name__ == "__main__":
    main(sys.argv[1])
