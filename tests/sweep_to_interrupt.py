"""A sweep that runs until interrupted; test_interrupt.py starts it as a separate process and sends Ctrl-C."""

import sys

import objectives
import optuna

from optuna_saturn import SaturnExecutor

if __name__ == "__main__":
    storage, log_dir = sys.argv[1], sys.argv[2]
    study = optuna.create_study(study_name="interrupted", storage=storage)
    executor = SaturnExecutor(devices=2, strategies=["single"], isolate_network=True, log_dir=log_dir, grace_period=5)
    executor.optimize(study, objectives.sleepy, n_trials=4)
