"""The benchmark that decides: a whole sweep under SaturnExecutor against plain ``study.optimize(n_jobs=N)``.

The same enqueued trials (no pruner), in one run, three ways, each in a fresh process (each pays its own imports
and start-up):

- **plain**: ``study.optimize(objective, n_trials, n_jobs=N)``, the same training loop written for a plain trial
  (``PlainTrial`` below: ``prepare`` moves the model, ``steps`` is ``range``), threads with one torch thread each;
- **cold**: ``SaturnExecutor(devices=N, strategies=["single", "ddp", "threads"])`` with an empty profile store;
- **warm**: the same executor again, on the store the cold run filled;
- **cold-ddp** (on request): cold without ``threads`` (one process on the cores of several CPU devices), on an
  empty store of its own;
- **profiled** (on request): every option of these trials measured first (``executor.profile``, what
  ``optuna-saturn profile`` does), on an empty store of its own, then the sweep; both in its wall clock.

Two objectives: the example's tiny GPT-2 (``examples/gpt2_sweep.py``), and a wider GPT-2 whose steps are longer;
on request (``--objective trainer``) the same GPT-2 sweep written with ``transformers.Trainer``
(``examples/hf_trainer_sweep.py``; plain Optuna runs the same Trainer in its threads); and ``--objective mixed``:
GPT-2 trials of widely different sizes and lengths (six medium ones, then two large, long ones enqueued last).
``--arms plain,plain1,cold,warm`` adds plain Optuna's other recipe: one trial at a time on every core.
Reported: the wall-clock ratio to plain, the makespan over the lower bound of the trials' actual runtimes,
per-trial start-up (launch to first step), the devices' idle seconds, the profiling device-seconds and their share
of all device time (devices x wall clock). "first trial at" is when the executor's first trial started (its
pool's start and the first description), and "tail past LB" how much later than that plus the lower bound the
last trial ended: the schedule's own loss, start-up aside (plain's is its wall clock past its lower bound).
"runtime / plain's, trials 3+" compares the same trials' runtimes (each trial's median over the rounds) once
plain's imports are paid, and "first two trials, plain's runtime past ours" is what plain pays inside its first two
trials (the model library's import, in both threads) that the executor pays before its first trial starts.

    python benchmarks/vs_optuna.py [--objective example|wide|trainer|both] [--n-trials 8] [--devices 2] [--repeats 1]
                                   [--rounds 1]

``--repeats R`` runs R sets of trials (seeds ``seed`` .. ``seed + R - 1``); ``--rounds K`` runs each set K times,
the arms interleaved, and reports each arm's median round and the ratio of the medians (with the range of the
rounds' ratios): on a noisy machine one round's ratio moves by about 15% from one run to the next.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE, os.path.join(ROOT, "examples")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gpt2_sweep  # noqa: E402
import hf_trainer_sweep  # noqa: E402
import optuna  # noqa: E402
import torch  # noqa: E402

WIDE_STEPS = 40


def wide_objective(trial) -> float:
    """GPT-2 with wider, deeper blocks than the example's: steps take several times longer."""
    lr = trial.suggest_float("lr", 1e-4, 1e-2, log=True)
    n_embd = trial.suggest_categorical("n_embd", [128, 192, 256])
    n_layer = trial.suggest_int("n_layer", 2, 4)
    batch_size = trial.suggest_categorical("batch_size", [16, 32])
    return _train_gpt2(trial, lr, n_embd, n_layer, batch_size, WIDE_STEPS)


def mixed_objective(trial) -> float:
    """GPT-2 trials of widely different sizes and lengths (issue 27's mixed workload): width, depth, batch and
    the number of steps are all searched, so one trial may train many times longer than another."""
    lr = trial.suggest_float("lr", 1e-4, 1e-2, log=True)
    n_embd = trial.suggest_categorical("n_embd", [64, 96, 128, 256])
    n_layer = trial.suggest_int("n_layer", 1, 4)
    batch_size = trial.suggest_categorical("batch_size", [16, 32, 64])
    return _train_gpt2(trial, lr, n_embd, n_layer, batch_size, trial.suggest_int("steps", 20, 120))


def _train_gpt2(trial, lr: float, n_embd: int, n_layer: int, batch_size: int, steps: int) -> float:
    """The example's GPT-2 of the given size, trained ``steps`` steps with AdamW on the example's data."""
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    transformers.logging.set_verbosity_error()
    ids = gpt2_sweep.token_ids()
    torch.manual_seed(trial.number)
    config = GPT2Config(
        vocab_size=gpt2_sweep.VOCAB_SIZE,
        n_positions=gpt2_sweep.SEQ_LEN,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    loader = torch.utils.data.DataLoader(gpt2_sweep.blocks(ids), batch_size=batch_size, shuffle=True, drop_last=True)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    batches = iter(loader)
    loss = torch.zeros(())
    for _ in trial.steps(steps):
        try:
            (x,) = next(batches)
        except StopIteration:  # (the next epoch)
            batches = iter(loader)
            (x,) = next(batches)
        optimizer.zero_grad()
        for part in trial.micro_batches(x.to(trial.device)):
            loss = model(input_ids=part, labels=part).loss
            trial.backward(loss)
        optimizer.step()
    return trial.reduce_mean(loss.detach())


#: The mixed workload's trials, enqueued in this order: six medium ones, then two large, long ones last (as a
#: sampler may well produce them).
MIXED = [
    *({"lr": 3e-3, "n_embd": width, "n_layer": 2, "batch_size": 16, "steps": 40} for width in (64, 96, 128) * 2),
    {"lr": 1e-3, "n_embd": 256, "n_layer": 4, "batch_size": 64, "steps": 30},
    {"lr": 1e-3, "n_embd": 256, "n_layer": 4, "batch_size": 64, "steps": 60},
]

OBJECTIVES = {
    "example": gpt2_sweep.objective,
    "wide": wide_objective,
    "trainer": hf_trainer_sweep.objective,
    "mixed": mixed_objective,
}


class PlainTrial:
    """The trial API the objectives use, for a plain Optuna trial in one process: what a user would write
    without optuna-saturn (``prepare`` moves the model, ``steps`` is ``range``, ``backward`` is ``loss.backward``)."""

    device = torch.device("cpu")
    rank = local_rank = 0
    world_size = 1
    is_main_process = True
    gradient_accumulation = 1
    is_profiling = False
    is_real_run = True

    def __init__(self, trial: optuna.Trial) -> None:
        self._trial = trial
        self.number = trial.number

    def __getattr__(self, name: str) -> Any:  # suggest_*, report, should_prune, set_user_attr, params
        return getattr(self._trial, name)

    def prepare(self, *objects: Any) -> Any:
        out = [o.to(self.device) if isinstance(o, torch.nn.Module) else o for o in objects]
        return out[0] if len(out) == 1 else tuple(out)

    def steps(self, total: int) -> Iterator[int]:
        return iter(range(total))

    def micro_batches(self, batch: Any) -> Iterator[Any]:
        yield batch

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def reduce_mean(self, value: Any, weight: float | None = None) -> float:
        return float(value)

    def prepare_trainer(self, trainer: Any, *, metric: str = "eval_loss") -> Any:
        """A Trainer as users run it under plain Optuna: reporting and pruning left to them (no pruner here)."""
        return trainer


def trial_params(objective: str, n_trials: int, seed: int = 0) -> list[dict]:
    """The trials every arm runs: sampled once, then enqueued in each (the mixed workload's are fixed)."""
    if objective == "mixed":
        return [dict(p) for p in MIXED]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    fixed = []
    for _ in range(n_trials):
        trial = study.ask()
        probe = PlainTrial(trial)
        if objective in ("example", "trainer"):  # the Trainer example searches the example's space
            params = {
                "lr": probe.suggest_float("lr", 1e-4, 1e-2, log=True),
                "n_embd": probe.suggest_categorical("n_embd", [32, 64, 96]),
                "n_layer": probe.suggest_int("n_layer", 1, 3),
                "batch_size": probe.suggest_categorical("batch_size", [8, 16, 32]),
            }
        else:
            params = {
                "lr": probe.suggest_float("lr", 1e-4, 1e-2, log=True),
                "n_embd": probe.suggest_categorical("n_embd", [128, 192, 256]),
                "n_layer": probe.suggest_int("n_layer", 2, 4),
                "batch_size": probe.suggest_categorical("batch_size", [16, 32]),
            }
        fixed.append(params)
    return fixed


def run_arm(arm: str, objective: str, params: list[dict], devices: int, store: str, log_dir: str) -> dict:
    """One arm in this process; returns its numbers."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(pruner=optuna.pruners.NopPruner())
    for p in params:
        study.enqueue_trial(p)
    started = time.time()
    cores = len(os.sched_getaffinity(0))  # (devices=N splits them into N CPU devices)
    if arm in ("plain", "plain1"):
        fn = OBJECTIVES[objective]
        if objective == "trainer" or arm == "plain1":
            # Trainer cannot run in Optuna's threads: its Accelerate state is one per process, and a second trial's
            # reset breaks the first ("AcceleratorState has no attribute distributed_type"). Without optuna-saturn
            # a user runs one trial at a time on every core. ("plain1": the same recipe, for any objective.)
            torch.set_num_threads(cores)
            study.optimize(lambda t: fn(PlainTrial(t)), n_trials=len(params), n_jobs=1)
        else:  # each job's share of the cores, as each of optuna-saturn's CPU devices has
            torch.set_num_threads(max(1, cores // devices))
            study.optimize(lambda t: fn(PlainTrial(t)), n_trials=len(params), n_jobs=devices)
        wall = time.time() - started
        runtimes = [(t.datetime_complete - t.datetime_start).total_seconds() for t in study.trials]
        used = devices if objective == "trainer" or arm == "plain1" else 1
        return {
            "wall": wall,
            "lower_bound": _lower_bound(runtimes, [used] * len(runtimes), devices),
            "runtimes": [round(r, 2) for r in runtimes],
        }
    from optuna_saturn import SaturnExecutor

    cpu_before = _cpu_seconds()
    # cold-ddp and profiled: cold arms of their own, each on an empty store
    own_store = {"cold-ddp": store + "-ddp", "profiled": store + "-profiled"}.get(arm, store)
    executor = SaturnExecutor(
        devices=devices,
        strategies=["single", "ddp"] if arm == "cold-ddp" else ["single", "ddp", "threads"],
        profile_store=own_store,
        log_dir=log_dir,
        isolate_network=True,
        progress="quiet",
        dashboard=False,
    )
    profiled_at = None
    if arm == "profiled":  # every option of these trials measured first (`optuna-saturn profile`), in the wall
        executor.profile(OBJECTIVES[objective], params=params)
        profiled_at = time.time() - started
    executor.optimize(study, OBJECTIVES[objective], n_trials=len(params))
    wall = time.time() - started
    driver_cpu = _cpu_seconds() - cpu_before
    trials = [t for t in study.trials if "saturn:actual_runtime" in t.system_attrs]
    attrs = [{**t.user_attrs, **t.system_attrs} for t in trials]
    last = study.user_attrs["saturn:last_sweep"]
    runtimes = [a["saturn:actual_runtime"] for a in attrs]
    return {
        "wall": wall,
        "driver_cpu_seconds": round(driver_cpu, 2),  # the executor's own process: describing, planning, the loop
        "profiled_at": profiled_at,
        "states": sorted({t.state.name for t in study.trials}),
        "lower_bound": _lower_bound(runtimes, [a["saturn:num_devices"] for a in attrs], devices),
        "makespan": max(a["saturn:actual_end"] for a in attrs) if attrs else 0.0,
        "options": [f"{a['saturn:strategy']}x{a['saturn:num_devices']}" for a in attrs],
        "startup": [
            round(a["saturn:first_step"] - a["saturn:actual_start"], 3) for a in attrs if "saturn:first_step" in a
        ],
        "setup": [
            round(a["saturn:objective_start"] - a["saturn:actual_start"], 3)
            for a in attrs
            if "saturn:objective_start" in a
        ],
        "first_job_at": min(a["saturn:actual_start"] for a in attrs) if attrs else None,
        "idle": last.get("idle_device_seconds", {}),
        "profiling_device_seconds": last["profiling_device_seconds"],
        "profiling_runs": last["profiling_runs"],
        "planning_seconds": last.get("planning_seconds"),
        "describing_seconds": last.get("describing_seconds"),
        "predicted_error": [
            abs(a["saturn:planned_runtime"] - a["saturn:actual_runtime"]) / a["saturn:actual_runtime"] for a in attrs
        ],
        "priced_by": [a.get("saturn:priced_by") for a in attrs],
        "runtimes": [round(r, 2) for r in runtimes],
        "timeline": [
            (
                t.number,
                a["saturn:strategy"],
                a["saturn:devices"],
                a["saturn:actual_start"],
                a["saturn:actual_end"],
                a["saturn:planned_runtime"],
            )
            for t, a in zip(trials, attrs)
        ],
    }


def _median_runtimes(runs: list[dict]) -> list[float]:
    """Each trial's median runtime over the rounds, in trial order (the same enqueued trial in every arm)."""
    return [statistics.median(trial) for trial in zip(*(run["runtimes"] for run in runs))]


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _lower_bound(runtimes: list[float], devices_used: list[int], devices: int) -> float:
    """No plan of these trials, at their actual runtimes on the devices they used, could end sooner."""
    if not runtimes:
        return 0.0
    return max(max(runtimes), sum(r * d for r, d in zip(runtimes, devices_used)) / devices)


def _subprocess(arm: str, objective: str, params: list[dict], devices: int, store: str, log_dir: str) -> dict:
    from workloads import arm_in_a_process

    return arm_in_a_process(
        __file__,
        "--arm",
        arm,
        "--objective",
        objective,
        "--devices",
        str(devices),
        "--store",
        store,
        "--log-dir",
        log_dir,
        "--params",
        json.dumps(params),
    )


def _ratio(runs: list[dict], baseline: list[dict] | None) -> str:
    """The ratio of the medians of two arms' walls, with the range of the rounds' own ratios ("-" without one)."""
    if not baseline:
        return "-"
    ratios = [run["wall"] / b["wall"] for run, b in zip(runs, baseline)]
    median = statistics.median(r["wall"] for r in runs) / statistics.median(b["wall"] for b in baseline)
    return f"{median:.2f}" + (f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else "")


def compare(
    objective: str, n_trials: int, devices: int, seed: int, arms: list[str], rounds: int = 1
) -> list[list[Any]]:
    """The arms on the same trials, ``rounds`` times, interleaved (plain, cold, warm, plain, cold, warm, ...; each
    round's cold arm on an empty store), so that the machine's slow spells fall on every arm alike. Each arm's row
    is its median round; "/ plain" is the ratio of the medians, with the range of the rounds' own ratios."""
    params = trial_params(objective, n_trials, seed)
    results: dict[str, list[dict]] = {arm: [] for arm in arms}
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            store, logs = os.path.join(tmp, "profiles"), os.path.join(tmp, "runs")
            for arm in arms:
                results[arm].append(_subprocess(arm, objective, params, devices, store, logs))
    plain_walls = [r["wall"] for r in results.get("plain", [])]
    plain = statistics.median(plain_walls) if plain_walls else float("nan")
    plain_runtimes = _median_runtimes(results["plain"]) if "plain" in results else None
    rows = []
    for arm, runs in results.items():
        r = sorted(runs, key=lambda run: run["wall"])[(len(runs) - 1) // 2]  # the median round (the lower of two)
        wall = statistics.median(run["wall"] for run in runs)
        ratios = [run["wall"] / p for run, p in zip(runs, plain_walls)]
        idle = sum(r.get("idle", {}).values())
        runtimes = _median_runtimes(runs)
        rows.append(
            [
                objective,
                arm,
                f"{wall:.1f}",
                f"{wall / plain:.2f}" + (f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""),
                _ratio(runs, results.get("plain1")),
                f"{r.get('makespan', r['wall']) / r['lower_bound']:.2f}" if r.get("lower_bound") else "-",
                f"{r.get('first_job_at') or 0.0:.1f}" if arm != "plain" else "-",
                f"{r.get('makespan', r['wall']) - (r.get('first_job_at') or 0.0) - r['lower_bound']:.1f}"
                if r.get("lower_bound")
                else "-",
                f"{statistics.median(r['startup']):.2f}" if r.get("startup") else "-",
                f"{idle:.1f}" if "idle" in r else "-",
                f"{r['profiling_device_seconds']:.1f} ({r['profiling_runs']})" if "profiling_runs" in r else "-",
                f"{100 * r['profiling_device_seconds'] / (devices * r['wall']):.0f}%" if "profiling_runs" in r else "-",
                f"{100 * statistics.median(r['predicted_error']):.0f}%" if r.get("predicted_error") else "-",
                f"{sum(runtimes[2:]) / sum(plain_runtimes[2:]):.2f}" if plain_runtimes and len(runtimes) > 2 else "-",
                f"{sum(plain_runtimes[:2]) - sum(runtimes[:2]):.1f}" if plain_runtimes and arm != "plain" else "-",
                " ".join(r.get("options", [])),
            ]
        )
        for run in runs:
            print(f"{objective} {arm}: {json.dumps(run)}", file=sys.stderr)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--objective", default="both", choices=["example", "wide", "trainer", "mixed", "both"])
    parser.add_argument("--n-trials", type=int, default=8)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run each set of trials this many times, the arms interleaved; report the medians",
    )
    parser.add_argument(
        "--arms",
        default="plain,cold,warm",
        help="which of plain (n_jobs=devices, a torch thread each), plain1 (n_jobs=1, a thread per "
        "device), cold, cold-ddp (cold without threads), profiled (every option measured first), warm; plain "
        "first: the ratios are to it",
    )
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--log-dir", help=argparse.SUPPRESS)
    parser.add_argument("--params", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:  # one arm, in its own process
        result = run_arm(args.arm, args.objective, json.loads(args.params), args.devices, args.store, args.log_dir)
        print(json.dumps(result))
        return
    gpt2_sweep.token_ids()  # the example's data, built once before any arm is timed
    from workloads import markdown_table

    rows = []
    for repeat in range(args.repeats):
        for objective in ["example", "wide"] if args.objective == "both" else [args.objective]:
            rows += compare(
                objective, args.n_trials, args.devices, args.seed + repeat, args.arms.split(","), args.rounds
            )
    print(
        markdown_table(
            [
                "objective",
                "arm",
                "wall (s)",
                "/ plain",
                "/ plain1",
                "makespan / LB",
                "first trial at (s)",
                "tail past LB (s)",
                "start-up median (s)",
                "idle (device-s)",
                "profiling (device-s, jobs)",
                "profiling share of device time",
                "prediction error (median)",
                "runtime / plain's, trials 3+",
                "first two trials, plain's runtime past ours (s)",
                "options",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
