"""One sweep of the soak (``benchmarks/soak.py``), in a process of its own so that it can be killed with ``kill -9``
and run again, as a user would rerun their script.

``python benchmarks/soak_sweep.py STORAGE LOG_DIR N_TRIALS SEED LEAKS_JSON``: ``STORAGE`` is a database URL or
``journal:PATH`` (Optuna's JournalStorage on a JournalFileBackend). The objective sleeps 0.2-2 s (``SOAK_SECONDS``:
``LOW,HIGH``), the time drawn from its one parameter, over 4 reported steps, and returns a value known from that
parameter, so that a result can be checked and two runs of the same params found. When ``optimize`` returns, the
sweep's threads and descriptors before and after it are written to ``LEAKS_JSON``: what the sweep left in the
process that ran it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

STUDY = "soak"
STEPS = 4
SECONDS_ENV = "SOAK_SECONDS"
#: The executor's options (the package's defaults otherwise): 2 CPU devices, a retry for a trial interrupted again.
DEVICES = 2
#: ``SOAK_STRATEGIES`` (comma-separated) names others; zero2 is there for the pool to handle DeepSpeed's build locks.
STRATEGIES_ENV = "SOAK_STRATEGIES"
STRATEGIES = "single,ddp,zero2"
MAX_RETRIES = 3


def seconds(x: float) -> float:
    low, high = (float(s) for s in os.environ.get(SECONDS_ENV, "0.2,2.0").split(","))
    return low + (high - low) * x


def expected(x: float, step: int) -> float:
    """What the objective reports at ``step`` for parameter ``x``; its result is the last step's."""
    return x + step


def objective(trial) -> float:
    x = trial.suggest_float("x", 0.0, 1.0)
    value = 0.0
    for step in trial.steps(STEPS):
        time.sleep(seconds(x) / STEPS)
        value = expected(x, step)
        trial.report(value, step)
    return value


def open_storage(spec: str):
    """The storage ``spec`` names: a database URL, or ``journal:PATH``."""
    import optuna

    if spec.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(spec.removeprefix("journal:")))
    return spec


def _snapshot() -> dict:
    return {"threads": sorted(t.name for t in threading.enumerate()), "fds": len(os.listdir("/proc/self/fd"))}


def _settled(before: dict, limit: float = 10.0) -> dict:
    """The process once the sweep's threads had ``limit`` seconds to end."""
    deadline = time.monotonic() + limit
    after = _snapshot()
    while time.monotonic() < deadline and (
        len(after["threads"]) > len(before["threads"]) or after["fds"] > before["fds"]
    ):
        time.sleep(0.2)
        after = _snapshot()
    return after


def main(spec: str, log_dir: str, n_trials: int, seed: int, leaks_json: str) -> None:
    import optuna

    from optuna_saturn import SaturnExecutor

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print(f"sweep pid {os.getpid()}: {n_trials} new trials, sampler seed {seed}", flush=True)
    sampler = optuna.samplers.RandomSampler(seed=seed)  # (a float: no two draws alike; each sweep its own seed)
    study = optuna.load_study(study_name=STUDY, storage=open_storage(spec), sampler=sampler)
    executor = SaturnExecutor(
        devices=DEVICES,
        strategies=os.environ.get(STRATEGIES_ENV, STRATEGIES).split(","),
        allow_shared_cores=True,
        isolate_network=True,
        log_dir=log_dir,
        profile=False,
        profile_store=os.path.join(os.path.dirname(log_dir), "profiles"),
        grace_period=5.0,
        max_retries=MAX_RETRIES,
        progress="plain",
        dashboard=False,
    )
    before = _snapshot()
    executor.optimize(study, objective, n_trials=n_trials)
    after = _settled(before)
    with open(leaks_json, "w", encoding="utf-8") as f:
        json.dump({"pid": os.getpid(), "before": before, "after": after}, f)
    print("sweep ended", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
