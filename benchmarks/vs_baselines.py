"""Real sweeps against what users run instead: plain Optuna two ways and Ray Tune (issue 27).

Workloads (GPT-2 on the example's data, 2 CPU devices):

- ``median``: TPE with a seed over a space that includes the model's size (width, depth, batch), Optuna's median
  pruner; Ray Tune gets ``OptunaSearch`` with the same space and seed and its ``MedianStoppingRule``;
- ``hyperband``: the same space under Optuna's Hyperband pruner; Ray Tune gets ASHA with the same rungs;
- ``lengths``: widely different lengths, enqueued, no pruner: six short trials, then one that trains five times
  longer (``steps`` is searched), last, as a sampler may produce it.

Arms, each in a fresh process, interleaved within each seed, every clock started when the arm's process is
launched (imports, Ray's start, the pool's start and profiling included):

- ``plain``: ``study.optimize(n_jobs=2)``, one torch thread per trial; ``plain1``: ``n_jobs=1``, two threads;
- ``raytune``: ``Tuner`` with ``tune.with_resources`` one CPU per trial, ``reuse_actors=True``, two at a time;
- ``cold``: ``SaturnExecutor(devices=2, strategies=["single", "ddp", "threads"])`` on an empty profile store;
  ``cold-ddp``: the same without ``threads`` (one process on both devices' cores), on an empty store of its own;
  ``warm``: ``cold``'s options on the store the cold arm filled; ``aware``: the cold arm's sampled trials enqueued in
  the same order and run again, warm, with prune-aware planning (``plan_for_pruning``), against ``warm``'s
  pruning-blind planning of the same trials (``--arms ...,warm-same`` runs them blind, enqueued the same way);
  ``rung``: the same, planned to the next rung (``plan_to_next_rung``).

Reported per arm (medians over the seeds): the wall clock to N trials and its ratio to the better plain arm (the
one with the shorter wall clock in that seed); for sampled workloads the best value so far against time (a PNG
with every seed's curve), its final best, and the time to reach the better plain arm's final best as a share of
that arm's wall clock ("never" if it is not reached); and each arm's lower bound from its own trials' measured
runtimes on the devices they used.

    python benchmarks/vs_baselines.py --workload median|hyperband|lengths [--seeds 3] [--n-trials 16]
                                      [--short-steps 40]
                                      [--arms plain,plain1,raytune,cold,warm] [--plot curves.png]
                                      [--json runs.json] [--from-json a.json,b.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE, os.path.join(ROOT, "examples")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gpt2_sweep  # noqa: E402
import optuna  # noqa: E402
import torch  # noqa: E402
from vs_optuna import PlainTrial, _cpu_seconds, _lower_bound  # noqa: E402

STEPS = 40  # a full trial of the sampled workloads
RUNGS = 4  # reports per full trial: every STEPS // RUNGS steps, the validation loss of VALIDATION_ROWS rows
VALIDATION_ROWS = 128
#: The lengths workload: six trials of this many steps, then one five times longer (``--short-steps``, handed to the
#: arms' processes and the pools' workers through the environment, which they inherit).
SHORT_STEPS = int(os.environ.get("VS_BASELINES_SHORT_STEPS", "40"))


def sampled_space(trial) -> dict[str, Any]:
    """The searched space: learning rate and the model's size (width, depth, batch)."""
    return {
        "lr": trial.suggest_float("lr", 3e-4, 1e-2, log=True),
        "n_embd": trial.suggest_categorical("n_embd", [64, 128, 256]),
        "n_layer": trial.suggest_int("n_layer", 1, 4),
        "batch_size": trial.suggest_categorical("batch_size", [16, 32]),
    }


def lengths_space(trial) -> dict[str, Any]:
    return {
        "lr": trial.suggest_float("lr", 3e-4, 1e-2, log=True),
        "n_embd": trial.suggest_categorical("n_embd", [96, 128]),
        "n_layer": trial.suggest_int("n_layer", 1, 4),
        "batch_size": trial.suggest_categorical("batch_size", [16, 32]),
        "steps": trial.suggest_int("steps", SHORT_STEPS, 5 * SHORT_STEPS),
    }


#: The lengths workload's trials, enqueued in this order: the long one last.
LENGTHS = [
    *({"lr": 3e-3, "n_embd": width, "n_layer": 2, "batch_size": 16, "steps": SHORT_STEPS} for width in (96, 128) * 3),
    {"lr": 3e-3, "n_embd": 128, "n_layer": 2, "batch_size": 16, "steps": 5 * SHORT_STEPS},
]


def train(
    trial, lr: float, n_embd: int, n_layer: int, batch_size: int, steps: int = STEPS, rungs: int = RUNGS
) -> float:
    """The example's GPT-2 of the given size, AdamW with a cosine schedule and clipping; the validation loss is
    reported ``rungs`` times and the trial pruned when the study's pruner says so. Returns the last report."""
    train_set, val_set = gpt2_sweep.train_and_validation()
    val_set = torch.utils.data.Subset(val_set, range(VALIDATION_ROWS))
    model = gpt2_sweep.tiny_gpt2(n_embd, n_layer, seed=trial.number)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=batch_size, shuffle=True, drop_last=True)
    val_loader = torch.utils.data.DataLoader(val_set, batch_size=32)
    model, optimizer, train_loader, val_loader = trial.prepare(model, optimizer, train_loader, val_loader)

    batches, value = iter(train_loader), float("nan")
    for step in trial.steps(steps):
        try:
            (x,) = next(batches)
        except StopIteration:
            batches = iter(train_loader)
            (x,) = next(batches)
        optimizer.zero_grad()
        for part in trial.micro_batches(x.to(trial.device)):
            trial.backward(model(input_ids=part, labels=part).loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if (step + 1) % (steps // rungs) == 0:
            value = gpt2_sweep.mean_validation_loss(trial, model, val_loader)
            trial.report(value, (step + 1) // (steps // rungs))
            if trial.should_prune():
                raise optuna.TrialPruned()
    return value


def sampled_objective(trial) -> float:
    return train(trial, **sampled_space(trial))


def lengths_objective(trial) -> float:
    return train(trial, **lengths_space(trial), rungs=1)


WORKLOADS = {
    "median": (sampled_objective, sampled_space),
    "hyperband": (sampled_objective, sampled_space),
    "lengths": (lengths_objective, lengths_space),
}


def make_study(workload: str, seed: int) -> optuna.Study:
    if workload == "lengths":
        return optuna.create_study(pruner=optuna.pruners.NopPruner())
    pruner = (
        optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=1)
        if workload == "median"
        else optuna.pruners.HyperbandPruner(min_resource=1, max_resource=RUNGS, reduction_factor=2)
    )
    return optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=4), pruner=pruner)


# -- the arms, each run in its own process -------------------------------------------------------------------------


def run_optuna_arm(
    arm: str,
    workload: str,
    seed: int,
    n_trials: int,
    devices: int,
    store: str,
    log_dir: str,
    launched: float,
    enqueue: list[dict] | None,
) -> dict:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    objective = WORKLOADS[workload][0]
    study = make_study(workload, seed)
    for params in enqueue or (LENGTHS if workload == "lengths" else []):
        study.enqueue_trial(params)
    n_trials = len(LENGTHS) if workload == "lengths" else n_trials
    if arm in ("plain", "plain1"):
        torch.set_num_threads(devices if arm == "plain1" else 1)
        study.optimize(lambda t: objective(PlainTrial(t)), n_trials=n_trials, n_jobs=1 if arm == "plain1" else devices)
        used = devices if arm == "plain1" else 1
        runtimes = [(t.datetime_complete - t.datetime_start).total_seconds() for t in study.trials]
        lower_bound = _lower_bound(runtimes, [used] * len(runtimes), devices)
        profiling = {}
    else:
        from optuna_saturn import SaturnExecutor

        strategies = ["single", "ddp"] if arm == "cold-ddp" else ["single", "ddp", "threads"]
        store = store + "-ddp" if arm == "cold-ddp" else store  # a cold arm of its own, on an empty store
        executor = SaturnExecutor(
            devices=devices,
            strategies=strategies,
            profile_store=store,
            log_dir=log_dir,
            isolate_network=True,
            progress="quiet",
            dashboard=False,
        )
        if arm in ("aware", "rung"):  # not public options: the benchmarks of issue 27 decide whether they become ones
            rungs = arm == "rung"
            executor._settings = dataclasses.replace(executor._settings, plan_for_pruning=True, plan_to_next_rung=rungs)
        cpu_before = _cpu_seconds()
        executor.optimize(study, objective, n_trials=n_trials)
        driver_cpu = _cpu_seconds() - cpu_before  # the executor's own process: asking, describing, planning
        attrs = [{**t.user_attrs, **t.system_attrs} for t in study.trials if "saturn:actual_runtime" in t.system_attrs]
        last = study.user_attrs["saturn:last_sweep"]
        profiling = {
            "profiling_device_seconds": last["profiling_device_seconds"],
            "profiling_runs": last["profiling_runs"],
            "idle_device_seconds": last.get("idle_device_seconds"),
            "driver_cpu_seconds": driver_cpu,
            "planning_seconds": last.get("planning_seconds"),
            "describing_seconds": last.get("describing_seconds"),
            # completed trials only: a pruned one ran a share of what was planned
            "prediction_errors": [
                abs(a["saturn:planned_runtime"] / a["saturn:actual_runtime"] - 1)
                for t, a in ((t, {**t.user_attrs, **t.system_attrs}) for t in study.trials)
                if t.state == optuna.trial.TrialState.COMPLETE
                and "saturn:planned_runtime" in a
                and a.get("saturn:actual_runtime")
            ],
        }
        lower_bound = _lower_bound(
            [a["saturn:actual_runtime"] for a in attrs], [a["saturn:num_devices"] for a in attrs], devices
        )
    ended = time.time()
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    return {
        "wall": ended - launched,
        "lower_bound": lower_bound,
        "curve": sorted((t.datetime_complete.timestamp() - launched, t.value) for t in done),
        "complete": len(done),
        "pruned": sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials),
        "trials": len(study.trials),
        "params": [t.params for t in sorted(study.trials, key=lambda t: t.number)],
        "options": [
            f"{t.system_attrs['saturn:strategy']}x{t.system_attrs['saturn:num_devices']}"
            for t in study.trials
            if "saturn:strategy" in t.system_attrs
        ],
        **profiling,
        "runs": [
            [
                t.number,
                t.state.name,
                round(t.datetime_start.timestamp() - launched, 2),
                round(t.datetime_complete.timestamp() - launched, 2),
                t.params.get("n_embd"),
                t.params.get("n_layer"),
                t.params.get("batch_size"),
                t.system_attrs.get("saturn:actual_runtime"),
                t.system_attrs.get("saturn:planned_runtime"),
                t.system_attrs.get("saturn:strategy"),
                t.system_attrs.get("saturn:num_devices"),
            ]
            for t in study.trials
            if t.datetime_complete
        ],
    }


class RayTuneTrial(PlainTrial):
    """The trial API for a Ray Tune function trainable: parameters from its config, reports to ``tune.report``
    (its scheduler stops a trial at a report, so ``should_prune`` is never true here)."""

    def __init__(self, config: dict) -> None:
        from ray import tune

        self._config, self._tune = config, tune
        self.number = abs(hash(tune.get_context().get_trial_id())) % 2**31
        self.reports = 0

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)

    def suggest_float(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._config[name]

    suggest_int = suggest_categorical = suggest_float

    def report(self, value: float, step: int) -> None:
        self.reports += 1
        self._tune.report({"loss": value, "rung": step, "at": time.time()})

    def should_prune(self) -> bool:
        return False


def _ray_trainable(config: dict) -> None:
    from ray import tune

    torch.set_num_threads(1)
    workload = config.pop("workload")
    trial = RayTuneTrial(LENGTHS[config["i"]] if workload == "lengths" else config)
    value = WORKLOADS[workload][0](trial)
    if not trial.reports:  # an objective that reports nothing: its value, once, at the end
        tune.report({"loss": value, "rung": 1, "at": time.time()})


def run_raytune_arm(workload: str, seed: int, n_trials: int, devices: int, log_dir: str, launched: float) -> dict:
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule
    from ray.tune.search.optuna import OptunaSearch

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    token = os.path.expanduser("~/.ray/auth_token")
    if not os.path.exists(token):  # Ray may write one, which later clusters on this machine then read: leave none
        import atexit

        atexit.register(lambda: os.path.exists(token) and os.remove(token))
    ray.init(
        num_cpus=devices,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        configure_logging=False,
    )
    if workload == "lengths":
        space, search, scheduler = {"i": tune.grid_search(list(range(len(LENGTHS))))}, None, FIFOScheduler()
        n_trials, rungs = 1, 1
    else:
        space, rungs = {}, RUNGS
        search = OptunaSearch(
            space=WORKLOADS[workload][1],
            metric="loss",
            mode="min",
            sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=4),
        )
        scheduler = (
            MedianStoppingRule(time_attr="training_iteration", grace_period=2, min_samples_required=4)
            if workload == "median"
            else ASHAScheduler(time_attr="training_iteration", max_t=RUNGS, grace_period=1, reduction_factor=2)
        )
    tuner = tune.Tuner(
        tune.with_resources(_ray_trainable, {"cpu": 1}),
        param_space={**space, "workload": workload},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            search_alg=search,
            scheduler=scheduler,
            num_samples=n_trials,
            reuse_actors=True,
            max_concurrent_trials=devices,
        ),
        run_config=tune.RunConfig(storage_path=log_dir, verbose=0),
    )
    results = tuner.fit()
    ended = time.time()
    curve, runtimes, pruned = [], [], 0
    for result in results:
        frame = result.metrics_dataframe
        if frame is None or frame.empty:
            continue
        runtimes.append(float(frame["time_total_s"].max()))
        last = frame.iloc[-1]
        if int(last["rung"]) >= rungs:
            curve.append((float(last["at"]) - launched, float(last["loss"])))
        else:
            pruned += 1
    ray.shutdown()
    return {
        "wall": ended - launched,
        "lower_bound": _lower_bound(runtimes, [1] * len(runtimes), devices),
        "curve": sorted(curve),
        "complete": len(curve),
        "pruned": pruned,
        "trials": len(runtimes),
        "params": [],
        "options": [],
    }


# -- the comparison --------------------------------------------------------------------------------------------


def _arm_process(
    arm: str,
    workload: str,
    seed: int,
    n_trials: int,
    devices: int,
    store: str,
    log_dir: str,
    enqueue: list[dict] | None,
) -> dict:
    from workloads import arm_in_a_process

    return arm_in_a_process(
        __file__,
        "--arm",
        arm,
        "--workload",
        workload,
        "--seed",
        str(seed),
        "--n-trials",
        str(n_trials),
        "--devices",
        str(devices),
        "--store",
        store,
        "--log-dir",
        log_dir,
        "--launched",
        repr(time.time()),
        "--enqueue",
        json.dumps(enqueue or []),
    )


def best_so_far(curve: list[list[float]]) -> list[tuple[float, float]]:
    """The best value so far at each completion: the step curve users judge an HPO run by."""
    best, out = float("inf"), []
    for at, value in curve:
        best = min(best, value)
        out.append((at, best))
    return out


def time_to_reach(curve: list[list[float]], target: float) -> float | None:
    return next((at for at, best in best_so_far(curve) if best <= target + 1e-12), None)


#: Arms that run the cold arm's sampled trials again, enqueued in the same order (what each runs as): the scheduler
#: compared on the same trials, the sampler's luck taken out.
SAME_TRIALS = {"plain-same": "plain", "aware": "aware", "rung": "rung", "warm-same": "warm"}
#: The paired ratio each of them reports, per seed: (numerator arm, denominator arm).
PAIRED = {"plain-same": ("cold", "plain-same"), "aware": ("aware", "warm-same"), "rung": ("rung", "warm-same")}


def compare(workload: str, seeds: list[int], n_trials: int, devices: int, arms: list[str]) -> dict[str, list[dict]]:
    results: dict[str, list[dict]] = {arm: [] for arm in arms}
    for seed in seeds:
        with tempfile.TemporaryDirectory() as tmp:
            store, logs = os.path.join(tmp, "profiles"), os.path.join(tmp, "runs")
            for arm in arms:
                enqueue = results["cold"][-1]["params"] if arm in SAME_TRIALS else None
                try:
                    run = _arm_process(
                        SAME_TRIALS.get(arm, arm), workload, seed, n_trials, devices, store, logs, enqueue
                    )
                except RuntimeError as error:  # once more: a benchmark of an hour should not end on one fluke
                    print(f"{workload} seed {seed} {arm} failed, run again: {error}", file=sys.stderr, flush=True)
                    run = _arm_process(
                        SAME_TRIALS.get(arm, arm), workload, seed, n_trials, devices, store, logs, enqueue
                    )
                run["seed"] = seed
                results[arm].append(run)
                print(
                    f"{workload} seed {seed} {arm}: wall {run['wall']:.1f} s, {run['complete']} complete, "
                    f"{run['pruned']} pruned, best {min((v for _, v in run['curve']), default=float('nan')):.4f}",
                    file=sys.stderr,
                    flush=True,
                )
    return results


def summary_rows(workload: str, results: dict[str, list[dict]]) -> list[list[Any]]:
    plains = [arm for arm in ("plain", "plain1") if arm in results]
    seeds = range(len(next(iter(results.values()))))
    better = [min(plains, key=lambda arm: results[arm][i]["wall"]) for i in seeds] if plains else []
    rows = []
    for arm, runs in results.items():
        ratios = [runs[i]["wall"] / results[better[i]][i]["wall"] for i in seeds] if better else []
        reach = []
        for i in seeds:
            if not better or workload == "lengths":
                break
            baseline = results[better[i]][i]
            target = min(v for _, v in baseline["curve"])
            at = time_to_reach(runs[i]["curve"], target)
            reach.append(None if at is None else at / baseline["wall"])
        reached = [r for r in reach if r is not None]
        rows.append(
            [
                workload,
                arm,
                f"{statistics.median(r['wall'] for r in runs):.1f}",
                f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "-",
                f"{statistics.median(r['wall'] / r['lower_bound'] for r in runs):.2f}",
                f"{statistics.median(min(v for _, v in r['curve']) for r in runs):.4f}"
                if workload != "lengths"
                else "-",
                (
                    f"{statistics.median(reach_or_inf(reach)):.2f} ({len(reached)}/{len(reach)} reached)"
                    if reach
                    else "-"
                ),
                " / ".join(f"{r['complete']}+{r['pruned']}" for r in runs),
                _paired(arm, results, seeds),
                f"{100 * statistics.median(e for r in runs for e in r['prediction_errors']):.0f}%"
                if any(r.get("prediction_errors") for r in runs)
                else "-",
            ]
        )
    return rows


def workload_bound(results: dict[str, list[dict]], i: int) -> float | None:
    """The lengths workload's lower bound in seed ``i``, from both plain arms' measured runtimes (one thread each
    in ``plain``, two in ``plain1``): every trial on the option that spends the fewest core-seconds, spread over
    the cores, and no sooner than its fastest option (None without both plain arms)."""
    if not {"plain", "plain1"} <= results.keys():
        return None
    one = {run[0]: run[3] - run[2] for run in results["plain"][i]["runs"]}
    two = {run[0]: run[3] - run[2] for run in results["plain1"][i]["runs"]}
    work = sum(min(one[n], 2 * two[n]) for n in one) / 2
    return max(work, max(min(one[n], two[n]) for n in one))


def _paired(arm: str, results: dict[str, list[dict]], seeds: range) -> str:
    if arm not in PAIRED or not all(a in results for a in PAIRED[arm]):
        return "-"
    top, bottom = PAIRED[arm]
    ratios = [results[top][i]["wall"] / results[bottom][i]["wall"] for i in seeds]
    return f"{top} / {bottom}: {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def reach_or_inf(reach: list[float | None]) -> list[float]:
    return [float("inf") if r is None else r for r in reach]


def plot(results_by_workload: dict[str, dict[str, list[dict]]], path: str) -> None:
    """Every seed's best-value-so-far curve, one panel per sampled workload, one colour per arm."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    sampled = {w: r for w, r in results_by_workload.items() if w != "lengths"}
    if not sampled:
        return
    figure = make_subplots(rows=1, cols=len(sampled), subplot_titles=[f"{w} pruner" for w in sampled])
    colours = {
        "plain": "#1f77b4",
        "plain1": "#17becf",
        "raytune": "#ff7f0e",
        "cold": "#2ca02c",
        "warm": "#d62728",
        "aware": "#9467bd",
        "warm-same": "#8c564b",
        "plain-same": "#bcbd22",
    }
    for col, (_workload, results) in enumerate(sampled.items(), start=1):
        for arm, runs in results.items():
            if arm in SAME_TRIALS:  # (the paired arms are in the tables)
                continue
            for k, run in enumerate(runs):
                points = best_so_far(run["curve"])
                if not points:
                    continue
                figure.add_trace(
                    go.Scatter(
                        x=[at for at, _ in points] + [run["wall"]],
                        y=[b for _, b in points] + [points[-1][1]],
                        mode="lines",
                        line={"shape": "hv", "color": colours.get(arm, "#7f7f7f")},
                        opacity=0.75,
                        name=arm,
                        legendgroup=arm,
                        showlegend=col == 1 and k == 0,
                    ),
                    row=1,
                    col=col,
                )
        figure.update_xaxes(title_text="wall clock from launch (s)", row=1, col=col)
        lowest = min(v for runs in results.values() for run in runs for _, v in run["curve"])
        figure.update_yaxes(
            title_text="best validation loss so far", range=[lowest - 0.02, lowest + 0.4], row=1, col=col
        )
    figure.update_layout(width=560 * len(sampled), height=460, template="plotly_white")
    figure.write_image(path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="median", help="median, hyperband, lengths, or several, comma-separated")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--n-trials", type=int, default=16)
    parser.add_argument("--short-steps", type=int, help="the lengths workload's short trials' steps (default 40)")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--arms", default="plain,plain1,raytune,cold,warm")
    parser.add_argument("--plot", help="write the best-value curves to this PNG")
    parser.add_argument("--json", help="write every run's numbers to this file")
    parser.add_argument("--from-json", help="comma-separated files --json wrote: report them, run nothing")
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--log-dir", help=argparse.SUPPRESS)
    parser.add_argument("--launched", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--enqueue", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.short_steps:  # (before any arm's process starts: they import this module again)
        os.environ["VS_BASELINES_SHORT_STEPS"] = str(args.short_steps)
    if args.arm:  # one arm, in its own process
        if args.arm == "raytune":
            result = run_raytune_arm(args.workload, args.seed, args.n_trials, args.devices, args.log_dir, args.launched)
        else:
            result = run_optuna_arm(
                args.arm,
                args.workload,
                args.seed,
                args.n_trials,
                args.devices,
                args.store,
                args.log_dir,
                args.launched,
                json.loads(args.enqueue) or None,
            )
        print(json.dumps(result))
        return
    gpt2_sweep.token_ids()  # the example's data, built once before any arm is timed
    from workloads import markdown_table

    if args.from_json:  # the tables and the plot again, from earlier runs' numbers
        everything = {}
        for path in args.from_json.split(","):
            with open(path) as f:
                everything.update(json.load(f))
    else:
        everything = {
            w: compare(
                w, list(range(args.seed, args.seed + args.seeds)), args.n_trials, args.devices, args.arms.split(",")
            )
            for w in args.workload.split(",")
        }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f)
    rows = [row for workload, results in everything.items() for row in summary_rows(workload, results)]
    print(
        markdown_table(
            [
                "workload",
                "arm",
                "wall (s, median)",
                "/ better plain (range)",
                "wall / own LB",
                "final best (median)",
                "time to better plain's best / its wall",
                "complete+pruned per seed",
                "same trials, paired (median, range)",
                "runtime prediction error (median, completed trials)",
            ],
            rows,
        )
    )
    for results in (r for w, r in everything.items() if w == "lengths"):
        for i in range(len(next(iter(results.values())))):
            bound = workload_bound(results, i)
            if bound is not None:
                better = min(results["plain"][i]["wall"], results["plain1"][i]["wall"])
                arms = ", ".join(f"{arm} {runs[i]['wall'] / bound:.2f}x" for arm, runs in results.items())
                print(
                    f"lengths, seed {i}: the workload's lower bound {bound:.1f} s, {bound / better:.2f} of the "
                    f"better plain arm's wall; {arms} of it"
                )
    if args.plot:
        plot(everything, args.plot)
        print(f"curves: {args.plot}")


if __name__ == "__main__":
    main()
