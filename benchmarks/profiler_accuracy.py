"""How well profiles predict whole-trial runtimes, and what profiling costs, on the example GPT-2 sweep.

For every completed trial: the runtime the planner used (profile-based, corrected by the sweep's observations
so far) against the measured one. The same sweep runs twice: with an empty profile store (cold) and again with
the store it filled (warm: the same models and batch sizes with new learning rates), and reports
profiling's share of the sweep's wall time in each.

    python benchmarks/profiler_accuracy.py [--n-trials 8] [--devices 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import optuna

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

import gpt2_sweep  # noqa: E402

from optuna_saturn import SaturnExecutor  # noqa: E402


def sweep(store: str, n_trials: int, devices: int, log_dir: str, seed: int, architectures=()) -> optuna.Study:
    study = optuna.create_study(  # no pruner: every trial runs to the end, so its runtime can be compared
        sampler=optuna.samplers.RandomSampler(seed=seed), pruner=optuna.pruners.NopPruner()
    )
    for params in architectures:  # the same models and batch sizes again; the learning rate is sampled anew
        study.enqueue_trial({k: v for k, v in params.items() if k != "lr"})
    executor = SaturnExecutor(
        devices=devices,
        strategies=["single", "ddp"],
        profile_store=store,
        log_dir=log_dir,
        isolate_network=True,
        progress="quiet",
        dashboard=False,
    )
    executor.optimize(study, gpt2_sweep.objective, n_trials=n_trials)
    return study


def breakdown(trial: optuna.trial.FrozenTrial) -> str:
    """Where a prediction went wrong: start-up, step time, and the time after the last step (final evaluation)."""
    attrs = {**trial.user_attrs, **trial.system_attrs}
    profile = next(
        p
        for p in attrs["saturn:profiles"]
        if p["strategy"] == attrs["saturn:strategy"] and p["devices"] == attrs["saturn:num_devices"]
    )
    step = attrs["saturn:step_seconds"]
    startup = attrs["saturn:first_step"] - attrs["saturn:actual_start"] - step
    tail = attrs["saturn:actual_runtime"] - startup - gpt2_sweep.TRAIN_STEPS * step
    return (
        f"start-up {profile['startup_seconds']:.1f} -> {startup:.1f} s, step {1e3 * profile['step_seconds']:.1f}"
        f" -> {1e3 * step:.1f} ms incl. evaluation, after the last step {tail:.1f} s"
    )


def row(label: str, study: optuna.Study) -> str:
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    for t in study.trials:
        if t.state != optuna.trial.TrialState.COMPLETE:
            print(f"  (trial {t.number} {t.state.name}: {t.system_attrs.get('saturn:fail_reason')})", file=sys.stderr)
    errors = [
        abs(t.system_attrs["saturn:planned_runtime"] - t.system_attrs["saturn:actual_runtime"])
        / t.system_attrs["saturn:actual_runtime"]
        for t in done
    ]
    for t in done:
        print(
            f"  trial {t.number}: {t.system_attrs['saturn:strategy']} predicted "
            f"{t.system_attrs['saturn:planned_runtime']:.1f} s, actual {t.system_attrs['saturn:actual_runtime']:.1f} s"
            f" ({breakdown(t)})",
            file=sys.stderr,
        )
    stats = study.user_attrs["saturn:last_sweep"]
    share = stats["profiling_wall_seconds"] / stats["wall_seconds"]
    return (
        f"| {label} | {len(done)} | {100 * statistics.median(errors):.1f}% | {100 * max(errors):.1f}% | "
        f"{stats['profiling_runs']} | {stats['profiling_wall_seconds']:.1f} | {stats['wall_seconds']:.1f} | "
        f"{100 * share:.1f}% |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-trials", type=int, default=8)
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    gpt2_sweep.token_ids()
    print(
        "| profile store | completed trials | median abs. runtime error | max error | profiling runs "
        "| profiling wall (s) | sweep wall (s) | profiling share |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        store, logs = os.path.join(tmp, "profiles"), os.path.join(tmp, "runs")
        cold = sweep(store, args.n_trials, args.devices, logs, seed=0)
        print(row("cold (empty)", cold), flush=True)
        warm = sweep(store, args.n_trials, args.devices, logs, seed=1, architectures=[t.params for t in cold.trials])
        print(row("warm (same models, new learning rates)", warm), flush=True)


if __name__ == "__main__":
    main()
