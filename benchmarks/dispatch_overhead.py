"""How long a trial's devices sit idle between one trial's end and the next trial's first step.

The idle gap splits into (a) the executor's reaction: noticing the exit, telling the study, planning, writing the
spec and starting the launcher; and (b) the next trial's start-up: launcher, interpreter, imports, joining the
process group, the channel handshake and the objective's first step. Part of (b) is the launcher's own cost,
which any torchrun-based setup pays: it is measured in the same run with a bare probe script, and the overhead
reported is what optuna-saturn adds beyond it.

    python benchmarks/dispatch_overhead.py [--trials 6] [--probes 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import optuna

from optuna_saturn import SaturnExecutor

HERE = os.path.dirname(os.path.abspath(__file__))


def tiny_objective(trial) -> float:
    x = trial.suggest_float("x", 0.0, 1.0)
    for _ in trial.steps(3):
        time.sleep(0.01)
    return x


def bare_launcher_startup(nprocs: int, repeats: int) -> list[float]:
    """Seconds from starting torchrun on a trivial script to the moment its processes have joined a group."""
    times = []
    for _ in range(repeats):
        started = time.time()
        out = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
             f"--nproc-per-node={nprocs}", "--max-restarts=0", "--monitor-interval=0.1",
             os.path.join(HERE, "_launcher_probe.py")],
            capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
        ).stdout
        ready = float(next(line.split()[1] for line in out.splitlines() if line.startswith("READY")))
        times.append(ready - started)
    return times


def sweep_gaps(strategy: str, devices: int, n_trials: int, log_dir: str) -> dict[str, list[float]]:
    """Run trials back to back on the same devices and measure each hand-over."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    executor = SaturnExecutor(
        devices=devices, strategies=[strategy], log_dir=log_dir, progress=None, dashboard=False, profile=False
    )
    executor.optimize(study, tiny_objective, n_trials=n_trials, batch_size=1)
    trials = sorted(study.trials, key=lambda t: t.user_attrs["saturn:actual_start"])
    gaps: dict[str, list[float]] = {"reaction": [], "startup": [], "idle": []}
    for prev, nxt in zip(trials, trials[1:]):
        end, start = prev.user_attrs["saturn:actual_end"], nxt.user_attrs["saturn:actual_start"]
        first_step = nxt.user_attrs["saturn:first_step"]
        gaps["reaction"].append(start - end)
        gaps["startup"].append(first_step - start)
        gaps["idle"].append(first_step - end)
    return gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--probes", type=int, default=5)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    median = statistics.median
    print("| launch | bare torchrun start-up (s) | executor reaction (s) | trial start-up to first step (s) "
          "| idle between trials (s) | overhead beyond launcher (s) | idle / bare launcher |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as log_dir:
        for strategy, devices in (("single", 1), ("ddp", 2)):
            bare = median(bare_launcher_startup(devices, args.probes))
            gaps = sweep_gaps(strategy, devices, args.trials, log_dir)
            idle = median(gaps["idle"])
            print(f"| {strategy} x{devices} | {bare:.2f} | {median(gaps['reaction']):.3f} | "
                  f"{median(gaps['startup']):.2f} | {idle:.2f} | {idle - bare:.2f} | {idle / bare:.2f} |")


if __name__ == "__main__":
    main()
