"""The pool host: one process that starts a warm worker per device and starts it again whenever it exits.

Run by :class:`~optuna_saturn.runner.pool.WorkerPool` as ``python -m optuna_saturn.runner._host CONFIG``, inside the
sweep's loopback-only network namespace when network isolation is on: its workers inherit that one namespace,
so they can form process groups with each other, and nothing they open is reachable from outside. A worker that
exits (recycled after a failure, an out-of-memory or memory growth, or killed by the executor) is replaced; one
that keeps dying right after it starts is given up on (its log says why; the executor reports it). SIGTERM ends the
host and its workers; so does the executor's death.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

#: A worker that exits this soon after starting, this many times in a row, is not started again.
_QUICK_EXIT_SECONDS = 5.0
_QUICK_EXITS = 3


def main(config_path: str) -> None:
    from optuna_saturn._lifetime import die_with_parent

    die_with_parent()
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    workers: dict[int, tuple[subprocess.Popen, float]] = {}
    quick_exits = [0] * len(config["devices"])

    def start(index: int) -> None:
        with open(os.path.join(config["folder"], f"worker-{index}.log"), "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "optuna_saturn._warm_worker", config_path, str(index)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        workers[process.pid] = (process, time.monotonic())

    def stop(signum: int, frame: object) -> None:
        for process, _ in workers.values():
            process.kill()
        for process, _ in workers.values():
            process.wait()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    for index in range(len(config["devices"])):
        start(index)
    while workers:
        pid, _ = os.wait()
        process, started = workers.pop(pid, (None, 0.0))
        if process is None:
            continue
        index = int(process.args[-1])
        quick_exits[index] = quick_exits[index] + 1 if time.monotonic() - started < _QUICK_EXIT_SECONDS else 0
        if quick_exits[index] < _QUICK_EXITS:
            start(index)


if __name__ == "__main__":
    main(sys.argv[1])
