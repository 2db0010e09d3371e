"""How long a trial's devices sit idle between one trial's end and the next trial's start, on warm workers.

For each hand-over on the same devices: the executor's reaction (the previous trial's end, as the executor saw it,
to the next job's start), the next job's start to its objective being called (the worker joining a fresh process
group, the channel handshake), and the objective's own set-up to its first step (building the model: the user's
code, reported apart). The idle time the target counts is end to objective call. For reference, the same
hand-over when a launcher starts the processes of every trial (an ``accelerate launch`` strategy template).

    python benchmarks/dispatch_overhead.py [--trials 8]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time

import optuna

from optuna_saturn import SaturnExecutor


def tiny_objective(trial) -> float:
    x = trial.suggest_float("x", 0.0, 1.0)
    for _ in trial.steps(3):
        time.sleep(0.01)
    return x


def sweep_gaps(strategy: str, devices: int, n_trials: int, log_dir: str, folder: str) -> dict[str, list[float]]:
    """Run trials back to back on the same devices and measure each hand-over."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    executor = SaturnExecutor(
        devices=devices,
        strategies=[strategy],
        log_dir=log_dir,
        progress=None,
        dashboard=False,
        profile=False,
        strategy_folders=[folder],
        isolate_network=True,
    )
    executor.optimize(study, tiny_objective, n_trials=n_trials, batch_size=1)
    trials = sorted(study.trials, key=lambda t: t.system_attrs["saturn:actual_start"])
    gaps: dict[str, list[float]] = {"reaction": [], "join": [], "setup": [], "idle": []}
    for prev, nxt in itertools.pairwise(trials):
        end, start = prev.system_attrs["saturn:actual_end"], nxt.system_attrs["saturn:actual_start"]
        called, first_step = nxt.system_attrs["saturn:objective_start"], nxt.system_attrs["saturn:first_step"]
        gaps["reaction"].append(start - end)
        gaps["join"].append(called - start)
        gaps["setup"].append(first_step - called)
        gaps["idle"].append(called - end)
    return gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=8)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    median = statistics.median
    print(
        "| trials run by | executor reaction (s) | job start to objective call (s) | idle between trials (s) "
        "| objective's own set-up to first step (s) |"
    )
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as log_dir:
        folder = os.path.join(log_dir, "strategies")
        os.makedirs(folder)
        with open(os.path.join(folder, "ddp-launched.toml"), "w", encoding="utf-8") as f:
            f.write('name = "ddp-launched"\nlauncher = "accelerate"\nengine = "ddp"\nmin_devices = 2\n')
        for label, strategy, devices in (
            ("warm workers, single x1", "single", 1),
            ("warm workers, ddp x2", "ddp", 2),
            ("a launch per trial, ddp x2", "ddp-launched", 2),
        ):
            gaps = sweep_gaps(strategy, devices, args.trials, log_dir, folder)
            print(
                f"| {label} | {median(gaps['reaction']):.3f} | {median(gaps['join']):.3f} | "
                f"{median(gaps['idle']):.3f} | {median(gaps['setup']):.3f} |"
            )


if __name__ == "__main__":
    main()
