"""One trial on 2 CPU devices, each way it can run: is one process on both devices' cores (``threads``) worth
offering next to DDP across them? (issue 27: "measure it first").

The trial is the lengths workload's long one (GPT-2 width 128, 2 layers, batch 16, 200 steps; AdamW, a cosine
schedule, clipping), or with ``--trial large`` the mixed workload's longest one (width 256, 4 layers, batch 64, 60
steps of AdamW). Each round runs, in a fresh process each, interleaved:

- ``plain 1 thread``: plain Optuna, one torch thread (what ``n_jobs=2`` gives each trial);
- ``plain 2 threads``: plain Optuna, two torch threads (``n_jobs=1``);
- ``single x1``, ``threads x2``, ``ddp x2``: ``SaturnExecutor(devices=2, strategies=[...], profile=False)``.

Reported: the trial's own runtime (objective start to end, the pool's start left out) and the arm's wall clock
(process launch to the end), medians over the rounds, each as a ratio to ``single x1`` in the same round.

    python benchmarks/one_process.py [--rounds 3] [--trial small|large] [--arms "single x1,threads x2,ddp x2"]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE, os.path.join(os.path.dirname(HERE), "examples")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: arm -> (strategy, or None for plain Optuna; torch threads of a plain arm)
ARMS = {
    "plain 1 thread": (None, 1),
    "plain 2 threads": (None, 2),
    "single x1": ("single", 0),
    "threads x2": ("threads", 0),
    "ddp x2": ("ddp", 0),
}


def run_arm(arm: str, trial_size: str, launched: float, log_dir: str) -> dict:
    import gpt2_sweep
    import optuna
    import torch
    import vs_baselines
    import vs_optuna
    from vs_optuna import PlainTrial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    gpt2_sweep.token_ids()
    study = optuna.create_study()
    if trial_size == "large":
        objective, params = vs_optuna.mixed_objective, vs_optuna.MIXED[-1]
    else:
        objective, params = vs_baselines.lengths_objective, vs_baselines.LENGTHS[-1]
    study.enqueue_trial(params)
    strategy, threads = ARMS[arm]
    if strategy is None:
        torch.set_num_threads(threads)
        study.optimize(lambda t: objective(PlainTrial(t)), n_trials=1)
        trial = study.trials[0]
        runtime = (trial.datetime_complete - trial.datetime_start).total_seconds()
    else:
        from optuna_saturn import SaturnExecutor

        SaturnExecutor(
            devices=2,
            strategies=[strategy],
            profile=False,
            isolate_network=True,
            log_dir=log_dir,
            progress="quiet",
            dashboard=False,
        ).optimize(study, objective, n_trials=1)
        trial = study.trials[0]
        runtime = trial.system_attrs["saturn:actual_runtime"]
    assert trial.state == optuna.trial.TrialState.COMPLETE, trial.system_attrs.get("saturn:fail_reason")
    return {"runtime": runtime, "wall": time.time() - launched, "value": trial.value}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trial", choices=["small", "large"], default="small")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated; the ratios need 'single x1'")
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--launched", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--log-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(run_arm(args.arm, args.trial, args.launched, args.log_dir)))
        return
    from workloads import arm_in_a_process, markdown_table

    arms = args.arms.split(",")
    unknown = sorted(set(arms) - set(ARMS))
    if unknown or "single x1" not in arms:
        parser.error(f"--arms: {unknown or 'single x1 is missing'}; choose among {', '.join(ARMS)}")
    results: dict[str, list[dict]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as logs:
        for round_ in range(args.rounds):
            for arm in arms:
                run = arm_in_a_process(
                    __file__, "--arm", arm, "--trial", args.trial, "--launched", repr(time.time()), "--log-dir", logs
                )
                results[arm].append(run)
                print(
                    f"round {round_} {arm}: trial {run['runtime']:.1f} s, wall {run['wall']:.1f} s, "
                    f"value {run['value']:.5f}",
                    file=sys.stderr,
                    flush=True,
                )
    rows = []
    for arm, runs in results.items():
        ratios = [r["runtime"] / s["runtime"] for r, s in zip(runs, results["single x1"])]
        walls = [r["wall"] / s["wall"] for r, s in zip(runs, results["single x1"])]
        rows.append(
            [
                arm,
                f"{statistics.median(r['runtime'] for r in runs):.1f}",
                f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
                f"{statistics.median(r['wall'] for r in runs):.1f}",
                f"{statistics.median(walls):.2f}",
                f"{statistics.median(r['value'] for r in runs):.5f}",
            ]
        )
    print(
        markdown_table(
            [
                "arm",
                "trial runtime (s, median)",
                "/ single x1 (range)",
                "wall (s, median)",
                "wall / single x1",
                "value (median)",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
