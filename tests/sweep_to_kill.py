"""A sweep of ``objectives.resumable`` run in a process of its own, so that a test can kill -9 it mid-trial:
``python sweep_to_kill.py STORAGE LOG_DIR STRATEGIES DEVICES [N_TRIALS]`` (STRATEGIES comma-separated)."""

import os
import sys

import objectives
import optuna

from optuna_saturn import SaturnExecutor

if __name__ == "__main__":
    storage, log_dir, strategies, devices = sys.argv[1], sys.argv[2], sys.argv[3].split(","), int(sys.argv[4])
    n_trials = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    print(f"executor pid {os.getpid()}", flush=True)  # (1 in a container without an init)
    study = optuna.load_study(study_name="killed", storage=storage)
    executor = SaturnExecutor(
        devices=devices,
        strategies=strategies,
        isolate_network=True,
        log_dir=log_dir,
        profile_store=f"{log_dir}/profiles",
        progress="plain",
        dashboard=False,
    )
    executor.optimize(study, objectives.resumable, n_trials=n_trials)
