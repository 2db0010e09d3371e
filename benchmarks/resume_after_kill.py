"""A trial killed at 80% of its steps, with its sweep (``kill -9``), then run again by the next sweep: how long the
run again takes against the whole uninterrupted trial (issue 12's target: at most 30% of it plus start-up).

Three sweeps of the same trial (an MLP trained with AdamW and a one-cycle schedule, a checkpoint every tenth of
its steps), each on its own executor: one uninterrupted; one killed with ``kill -9`` once the trial has
checkpointed at 80%; the next one, which ends the orphan FAIL and runs its params again from that checkpoint.

    python benchmarks/resume_after_kill.py [--strategy ddp] [--devices 2]      (SATURN_BENCH_STEPS=1000: its steps)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

import optuna
import psutil
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

from workloads import markdown_table  # noqa: E402

STEPS = int(os.environ.get("SATURN_BENCH_STEPS", "1000"))
KILL_AT = int(0.8 * STEPS)


def objective(trial) -> float:
    lr = trial.suggest_float("lr", 1e-3, 1e-2, log=True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 64, generator=g)
    y = torch.sin(x @ torch.randn(64, 1, generator=g))
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 512), torch.nn.GELU(), torch.nn.Linear(512, 512), torch.nn.GELU(), torch.nn.Linear(512, 1)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=256, shuffle=True)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=STEPS)
    start = trial.restore(model, optimizer, scheduler)
    hang = os.environ.get("SATURN_BENCH_HANG") == "1" and start == 0
    loss = torch.zeros(())
    for step in trial.steps(STEPS, start=start):
        if step % len(loader) == 0:
            batches = iter(loader)
        bx, by = next(batches)
        optimizer.zero_grad()
        for mx, my in trial.micro_batches((bx.to(trial.device), by.to(trial.device))):
            loss = torch.nn.functional.mse_loss(model(mx), my)
            trial.backward(loss)
        optimizer.step()
        scheduler.step()
        if (step + 1) % (STEPS // 10) == 0:
            trial.checkpoint(step + 1, model, optimizer, scheduler)
            trial.report(float(loss), step + 1)
            if hang and step + 1 == KILL_AT:
                time.sleep(3600)  # the benchmark kills the sweep here
    return trial.reduce_mean(loss.detach())


def _executor(args: argparse.Namespace, folder: str):
    from optuna_saturn import SaturnExecutor

    return SaturnExecutor(
        devices=args.devices,
        strategies=[args.strategy],
        isolate_network=True,
        log_dir=os.path.join(folder, "runs"),
        profile_store=os.path.join(folder, "profiles"),
        progress="quiet",
        dashboard=False,
    )


def _sweep(args: argparse.Namespace, storage: str, folder: str, n_trials: int) -> None:
    study = optuna.load_study(study_name="resume", storage=storage)
    _executor(args, folder).optimize(study, objective, n_trials=n_trials)


def _timings(trial: optuna.trial.FrozenTrial) -> tuple[float, float]:
    a = {**trial.user_attrs, **trial.system_attrs}
    return a["saturn:actual_runtime"], a["saturn:first_step"] - a["saturn:actual_start"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)  # storage, folder: the sweep to kill
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.child:
        _sweep(args, *args.child, n_trials=1)
        return
    with tempfile.TemporaryDirectory() as folder:
        storage = f"sqlite:///{folder}/study.sqlite3"
        optuna.create_study(study_name="resume", storage=storage).enqueue_trial({"lr": 3e-3})
        _sweep(args, storage, folder, n_trials=1)  # the uninterrupted run
        optuna.load_study(study_name="resume", storage=storage).enqueue_trial({"lr": 3e-3})
        child = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--strategy",
                args.strategy,
                "--devices",
                str(args.devices),
                "--child",
                storage,
                folder,
            ],
            env={**os.environ, "SATURN_BENCH_HANG": "1"},
        )
        while True:
            trial = optuna.load_study(study_name="resume", storage=storage).trials[1]
            if (trial.system_attrs.get("saturn:checkpoint") or {}).get("step") == KILL_AT:
                break
            if child.poll() is not None:
                raise SystemExit("the sweep to kill ended on its own")
            time.sleep(0.1)
        descendants = psutil.Process(child.pid).children(recursive=True)
        child.send_signal(signal.SIGKILL)
        child.wait()
        psutil.wait_procs(descendants, timeout=30)
        started = time.time()
        _sweep(args, storage, folder, n_trials=0)  # runs the orphan's params again
        sweep_wall = time.time() - started
        trials = optuna.load_study(study_name="resume", storage=storage).trials
    whole, _whole_startup = _timings(trials[0])
    again, again_startup = _timings(trials[2])
    assert trials[2].system_attrs["saturn:resumed_from_step"] == KILL_AT
    print(
        markdown_table(
            [
                "strategy",
                "steps",
                "uninterrupted (s)",
                "run again from 80% (s)",
                "its start-up (s)",
                "run again / uninterrupted",
                "(run again - start-up) / uninterrupted",
                "next sweep's wall (s)",
                "value uninterrupted",
                "value resumed",
            ],
            [
                [
                    f"{args.strategy} x{args.devices}",
                    STEPS,
                    f"{whole:.1f}",
                    f"{again:.1f}",
                    f"{again_startup:.2f}",
                    f"{again / whole:.2f}",
                    f"{(again - again_startup) / whole:.2f}",
                    f"{sweep_wall:.1f}",
                    f"{trials[0].value:.4e}",
                    f"{trials[2].value:.4e}",
                ]
            ],
        )
    )


if __name__ == "__main__":
    main()
