"""A deadline on a real CPU sweep (issue 39): the example's GPT-2 trials (``examples/gpt2_sweep.py``; the same 8
enqueued trials in each arm, as ``vs_optuna.py`` samples them) on 2 CPU devices, with a warm profile store.

1. The makespan mode: its end ``E`` (the sweep's wall clock, start-up and describing included).
2. A deadline of ``--factor`` x E (1.3 by default), which the first plan says it can meet (else it is refused,
   and the run says so): the sweep's end against it (met within 10%?), its device-seconds against the makespan
   mode's.
3. A deadline of 0.3 x E, which no plan meets: refused before any trial starts, and how soon.

Each arm in a fresh process, inside a loopback-only network namespace:
``unshare -n sh -c 'ip link set lo up && exec "$@"' sh python benchmarks/deadline_real.py``."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "examples")]


def arm(deadline: float | None, store: str, log_dir: str) -> dict:
    """One sweep in this process; its wall clock, device-seconds, or the refusal."""
    import gpt2_sweep
    import optuna
    from vs_optuna import trial_params

    from optuna_saturn import SaturnExecutor
    from optuna_saturn.planner import DeadlineUnreachable

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(pruner=optuna.pruners.NopPruner())
    for params in trial_params("example", 8):
        study.enqueue_trial(params)
    executor = SaturnExecutor(
        devices=2, profile_store=store, log_dir=log_dir, isolate_network=True, progress="quiet", dashboard=False,
        deadline=deadline,
    )  # fmt: skip
    started = time.time()
    try:
        executor.optimize(study, gpt2_sweep.objective, n_trials=8)
    except DeadlineUnreachable as refused:
        return {"refused_after": time.time() - started, "earliest_end": refused.earliest_end, "message": str(refused)}
    last = study.user_attrs["saturn:last_sweep"]
    return {"wall": time.time() - started, "device_seconds": last["device_seconds"]}


def _subprocess(deadline: float | None, store: str, log_dir: str) -> dict:
    code = f"import json, deadline_real; print(json.dumps(deadline_real.arm({deadline!r}, {store!r}, {log_dir!r})))"
    out = subprocess.run([sys.executable, "-c", code], cwd=HERE, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--factor", type=float, default=1.3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="saturn-deadline-") as folder:
        store, log_dir = os.path.join(folder, "profiles"), os.path.join(folder, "runs")
        _subprocess(None, store, log_dir)  # (warms the profile store: the arms below plan from measurements)
        makespan = _subprocess(None, store, log_dir)
        end = makespan["wall"]
        deadline = _subprocess(args.factor * end, store, log_dir)
        refused = _subprocess(0.3 * end, store, log_dir)
    print(f"makespan mode: ends at {end:.1f} s, {makespan['device_seconds']:.1f} device-seconds")
    if "refused_after" in deadline:
        print(f"deadline {args.factor} x E = {args.factor * end:.1f} s: refused ({deadline['message']})")
    else:
        ratio = deadline["wall"] / (args.factor * end)
        print(
            f"deadline {args.factor} x E = {args.factor * end:.1f} s: ends at {deadline['wall']:.1f} s "
            f"({ratio:.2f} of the deadline: {'met' if ratio <= 1 else 'late'}, {'within' if ratio <= 1.1 else 'past'} "
            f"10%), {deadline['device_seconds']:.1f} device-seconds "
            f"({100 * (1 - deadline['device_seconds'] / makespan['device_seconds']):.1f}% fewer)"
        )
    if "refused_after" in refused:
        after = refused["refused_after"]
        print(f"deadline 0.3 x E = {0.3 * end:.1f} s: refused after {after:.1f} s: {refused['message']}")
    else:
        print(f"deadline 0.3 x E: NOT refused; ended at {refused['wall']:.1f} s")


if __name__ == "__main__":
    main()
