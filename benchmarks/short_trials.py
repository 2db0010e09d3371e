"""What the executor costs per trial: many short trials under SaturnExecutor against plain ``study.optimize``.

200 trials of 0.2 s on 2 devices, each arm in a fresh process, its whole wall clock (imports, the pool's start,
every ask and tell) timed from outside, in one run:

- **plain**: ``study.optimize(objective, n_trials, n_jobs=2)``, the user's objective as it is;
- **saturn**: ``SaturnExecutor(devices=2).optimize(study, objective, n_trials)`` with the defaults (every strategy,
  profiling on, the dashboard publisher on when optuna-dashboard is installed);
- **saturn-steps**: the same, with the objective written as a ``trial.steps()`` loop (plain runs it with
  ``steps`` as ``range``).

Each study is a fresh one on the same kind of storage (``--storage sqlite``, the default: a file in a temporary
folder; or a PostgreSQL URL, a database per arm is the caller's). Reported: each arm's wall clock, its ratio to
plain's, and the median bookkeeping per trial (the time between trials on a device that plain does not spend:
the sweep's wall clock times its devices, less the trials' own sleep, over the trials).

    python benchmarks/short_trials.py [--n-trials 200] [--seconds 0.2] [--arms plain,saturn,saturn-steps]
                                      [--storage sqlite|postgresql://...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEVICES = 2


def plain_objective(trial) -> float:
    """The user's objective as it is: a suggestion, 0.2 s of work."""
    x = trial.suggest_float("x", -10, 10)
    time.sleep(float(os.environ["SHORT_TRIAL_SECONDS"]))
    return x * x


def steps_objective(trial) -> float:
    """The same, as a loop of four steps over ``trial.steps`` (``range`` under plain Optuna)."""
    x = trial.suggest_float("x", -10, 10)
    steps = trial.steps(4) if hasattr(trial, "steps") else range(4)
    for _ in steps:
        time.sleep(float(os.environ["SHORT_TRIAL_SECONDS"]) / 4)
    return x * x


def run_arm(arm: str, n_trials: int, storage: str, work: str) -> None:
    """In a fresh process: one arm's sweep (see the module's docstring)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=storage, study_name=f"{arm}-{uuid.uuid4().hex[:8]}")
    objective = steps_objective if arm == "saturn-steps" else plain_objective
    if arm == "plain":
        study.optimize(objective, n_trials=n_trials, n_jobs=DEVICES)
    else:
        from optuna_saturn import SaturnExecutor

        SaturnExecutor(
            devices=DEVICES,
            log_dir=os.path.join(work, "runs"),
            profile_store=os.path.join(work, "profiles"),
            progress=None,
        ).optimize(study, objective, n_trials=n_trials)
    states = [t.state.name for t in study.trials]
    spans = [
        (t.datetime_complete - t.datetime_start).total_seconds() - float(os.environ["SHORT_TRIAL_SECONDS"])
        for t in study.trials
        if t.datetime_start and t.datetime_complete
    ]
    print(json.dumps({"complete": states.count("COMPLETE"), "trials": len(states), "span": statistics.median(spans)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-trials", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=0.2)
    parser.add_argument("--arms", default="plain,saturn,saturn-steps")
    parser.add_argument("--storage", default="sqlite")
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ["SHORT_TRIAL_SECONDS"] = str(args.seconds)
    if args.arm:
        run_arm(args.arm, args.n_trials, args.storage, args.work)
        return
    results = {}
    for arm in args.arms.split(","):
        work = tempfile.mkdtemp(prefix=f"short-{arm}-")
        storage = f"sqlite:///{work}/study.sqlite3" if args.storage == "sqlite" else args.storage
        command = [
            sys.executable,
            __file__,
            "--arm",
            arm,
            "--work",
            work,
            "--storage",
            storage,
            "--n-trials",
            str(args.n_trials),
            "--seconds",
            str(args.seconds),
        ]
        began = time.perf_counter()
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": ROOT, "OPTUNA_SATURN_LEASES": "off"},
        )
        wall = time.perf_counter() - began
        if done.returncode != 0:
            sys.exit(f"{arm} failed:\n{done.stdout}\n{done.stderr[-3000:]}")
        counts = json.loads(done.stdout.strip().splitlines()[-1])
        results[arm] = {"wall": wall, **counts}
    plain = results.get("plain", {}).get("wall")
    print(f"{args.n_trials} trials of {args.seconds} s on {DEVICES} devices, storage {args.storage}")
    print(f"{'arm':<14}{'wall s':>9}{'/ plain':>9}{'ms per trial':>14}{'span ms':>9}{'complete':>10}")
    for arm, r in results.items():
        ratio = f"{r['wall'] / plain:.2f}x" if plain else "-"
        per_trial = (r["wall"] * DEVICES - args.n_trials * args.seconds) / args.n_trials * 1e3
        print(
            f"{arm:<14}{r['wall']:>9.1f}{ratio:>9}{per_trial:>14.0f}{r['span'] * 1e3:>9.0f}"
            f"{r['complete']:>7}/{r['trials']}"
        )


if __name__ == "__main__":
    main()
