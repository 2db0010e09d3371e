"""Elastic resize for real, on CPU devices: the same sweep with ``elastic=True`` and ``elastic=False``, in one run.

The trials: a GPT-2 (``n_embd`` 192, 3 layers, the example's data and tokenizer) trained with AdamW and a one-cycle
schedule, with ``trial.restore`` before its loop and ``trial.checkpoint`` every 10 of its 60 steps. Some trials
are pruned early: the objective raises ``TrialPruned`` at the fraction of its steps given by its ``prune_at``
parameter (enqueued, standing in for a pruner's decision: the planner does not foresee it). The prunes leave a
trial alone on one device at the sweep's tail; with elastic resize it moves to both.

Both arms run the same enqueued trials on 2 devices with ``strategies=["single", "ddp"]``, each in a fresh
process, on a copy of one profile store filled first by a profile-only pass (so neither arm pays profiling). The
order of the arms alternates between repeats. Reported: each arm's wall clock, its makespan over the lower bound
of its trials' actual runtimes, the moves made, and the ratio elastic / not elastic.

    python benchmarks/elastic_real.py [--repeats 2]          (SATURN_BENCH_STEPS=60: each trial's steps)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE, os.path.join(ROOT, "examples")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gpt2_sweep  # noqa: E402
import optuna  # noqa: E402
import torch  # noqa: E402

STEPS, EVERY = int(os.environ.get("SATURN_BENCH_STEPS", "60")), 10
PRUNE_AT = (1.0, 0.2, 0.2, 1.0)  # per trial: the fraction of its steps where it is pruned (1.0: never)


def objective(trial) -> float:
    lr = trial.suggest_float("lr", 1e-4, 1e-2, log=True)
    prune_at = trial.suggest_float("prune_at", 0.0, 1.0)
    ids = gpt2_sweep.token_ids()
    model = gpt2_sweep.tiny_gpt2(192, 3, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    loader = torch.utils.data.DataLoader(gpt2_sweep.blocks(ids), batch_size=16, shuffle=True, drop_last=True)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=STEPS)
    start = trial.restore(model, optimizer, scheduler)
    batches = iter(loader)
    loss = torch.zeros(())
    for step in trial.steps(STEPS, start=start):
        try:
            (x,) = next(batches)
        except StopIteration:
            batches = iter(loader)
            (x,) = next(batches)
        optimizer.zero_grad()
        for part in trial.micro_batches(x.to(trial.device)):
            loss = model(input_ids=part, labels=part).loss
            trial.backward(loss)
        optimizer.step()
        scheduler.step()
        if (step + 1) % EVERY == 0:
            trial.report(trial.reduce_mean(loss.detach()), step + 1)
            if prune_at < 1.0 and step + 1 >= prune_at * STEPS:
                raise optuna.TrialPruned()
            trial.checkpoint(step + 1, model, optimizer, scheduler)
    return trial.reduce_mean(loss.detach())


def run_arm(arm: str, store: str, log_dir: str) -> dict:
    from optuna_saturn import SaturnExecutor

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    for i, prune_at in enumerate(PRUNE_AT):
        study.enqueue_trial({"lr": 1e-3 * (1 + i), "prune_at": prune_at})
    executor = SaturnExecutor(
        devices=2,
        strategies=["single", "ddp"],
        profile_store=store,
        log_dir=log_dir,
        isolate_network=True,
        progress="quiet",
        dashboard=False,
        elastic=arm != "fixed",
    )
    started = time.time()
    if arm == "profile":  # every trial has the same workload: one profiled configuration stands for all
        executor.profile(objective, n_trials=1)
        return {"wall": time.time() - started}
    executor.optimize(study, objective, n_trials=len(PRUNE_AT))
    wall = time.time() - started
    attrs = [t.system_attrs for t in study.trials]  # (the sweep's records)
    # device-seconds: each trial's last run, and the runs a move ended (saturn:moves)
    runtimes = [
        a["saturn:actual_runtime"] * a["saturn:num_devices"]
        + sum((m["at"] - m["started"]) * len(m["device_ids"]) for m in a.get("saturn:moves", []))
        for a in attrs
    ]
    return {
        "wall": wall,
        "states": [t.state.name for t in study.trials],
        "makespan": max(a["saturn:actual_end"] for a in attrs),
        "lower_bound": max(sum(runtimes) / 2, max(r / a["saturn:num_devices"] for r, a in zip(runtimes, attrs))),
        "moves": sum(len(a.get("saturn:moves", [])) for a in attrs),
        "options": [f"{a['saturn:strategy']}x{a['saturn:num_devices']}" for a in attrs],
        "values": [t.value for t in study.trials],
    }


def _subprocess(arm: str, store: str, log_dir: str) -> dict:
    from workloads import arm_in_a_process

    return arm_in_a_process(__file__, "--arm", arm, "--store", store, "--log-dir", log_dir)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--log-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(run_arm(args.arm, args.store, args.log_dir)))
        return
    from workloads import markdown_table

    gpt2_sweep.token_ids()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        filled = os.path.join(tmp, "profiles")
        _subprocess("profile", filled, os.path.join(tmp, "runs"))
        for repeat in range(args.repeats):
            arms = ["elastic", "fixed"] if repeat % 2 == 0 else ["fixed", "elastic"]
            results = {}
            for arm in arms:
                store = os.path.join(tmp, f"profiles-{arm}-{repeat}")
                shutil.copytree(filled, store)
                results[arm] = _subprocess(arm, store, os.path.join(tmp, "runs"))
                print(f"{arm}: {json.dumps(results[arm])}", file=sys.stderr)
            for arm in arms:
                r = results[arm]
                rows.append(
                    [
                        repeat,
                        arm,
                        f"{r['wall']:.1f}",
                        f"{r['wall'] / results['fixed']['wall']:.2f}",
                        f"{r['makespan'] / r['lower_bound']:.2f}",
                        r["moves"],
                        " ".join(r["options"]),
                        " ".join(s[0] for s in r["states"]),
                    ]
                )
    print(
        markdown_table(
            ["repeat", "arm", "wall (s)", "/ not elastic", "makespan / LB", "moves", "options (last run)", "states"],
            rows,
        )
    )


if __name__ == "__main__":
    main()
