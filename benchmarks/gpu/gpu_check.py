"""GPU check for optuna-saturn, run by .gpu/check.sh on the device machine (works on CPU too, for a dry run).

    python benchmarks/gpu/gpu_check.py env                 # versions, CUDA, the devices "auto" takes, planner backends
    python benchmarks/gpu/gpu_check.py sweep [--n-trials 8] # the example's GPT-2: plain Optuna vs SaturnExecutor
    python benchmarks/gpu/gpu_check.py parity              # one-device strategies train like "single" (rel 1e-4)

Each part prints a last line "PART <name>: OK" or "PART <name>: FAILED (...)" and exits non-zero on failure.
A JSON summary of each part goes to $OUT/gpu-check-<part>.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (ROOT / "tests", ROOT / "examples"):  # (not ROOT: optuna_saturn comes from the installed package)
    sys.path.insert(0, str(p))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

WORK = Path(os.environ.get("GPU_CHECK_WORK", tempfile.gettempdir() + "/gpu-check"))
WORK.mkdir(parents=True, exist_ok=True)
os.environ.setdefault("SATURN_EXAMPLE_DATA", str(WORK / "example-data"))


def _dump(part: str, summary: dict) -> None:
    out = os.environ.get("OUT")
    if out:
        Path(out, f"gpu-check-{part}.json").write_text(json.dumps(summary, indent=1, default=str))


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


# ---------------------------------------------------------------------------------------------------- env
def part_env() -> int:
    import torch

    info: dict = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cuda_device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
    if info["cuda_available"]:
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(info["cuda_device_count"])]
        x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            x @ x
        torch.cuda.synchronize()
        info["bf16_matmul_tflops"] = round(10 * 2 * 4096**3 / (time.perf_counter() - t0) / 1e12, 1)
    import importlib.metadata as md

    for name in (
        "optuna",
        "optuna-saturn",
        "sqlalchemy",
        "alembic",
        "transformers",
        "accelerate",
        "tokenizers",
        "highspy",
        "ortools",
        "protobuf",
        "pandas",
        "numpy",
        "setuptools",
        "deepspeed",
        "gurobipy",
    ):
        try:
            info[f"v:{name}"] = md.version(name)
        except md.PackageNotFoundError:
            info[f"v:{name}"] = None
    for mod in ("highspy", "ortools.sat.python.cp_model", "deepspeed", "gurobipy"):
        try:
            __import__(mod)
            info[f"import:{mod}"] = "ok"
        except Exception as e:
            info[f"import:{mod}"] = f"{type(e).__name__}: {e}"[:200]
    import optuna_saturn
    from optuna_saturn.devices import resolve_devices
    from optuna_saturn.strategy import load_strategies

    info["optuna_saturn_file"] = optuna_saturn.__file__
    info["strategies_known"] = sorted(load_strategies())
    info["auto_devices"] = [str(d) for d in resolve_devices("auto")]
    for k, v in info.items():
        print(f"  {k}: {v}")
    _dump("env", info)
    ok = bool(info["strategies_known"]) and info["auto_devices"]
    print(f"PART env: {'OK' if ok else 'FAILED (no strategies or no devices)'}")
    return 0 if ok else 1


# ---------------------------------------------------------------------------------------------------- sweep
class PlainTrial:
    """The trial API the example's objective uses, for a plain Optuna trial (as benchmarks/vs_optuna.py's):
    ``prepare`` moves the model to the GPU, ``steps`` is ``range``, ``backward`` is ``loss.backward``."""

    rank = local_rank = 0
    world_size = 1
    is_main_process = True
    gradient_accumulation = 1
    is_profiling = False
    is_real_run = True

    def __init__(self, trial, device) -> None:
        self._trial = trial
        self.number = trial.number
        self.device = device

    def __getattr__(self, name):
        return getattr(self._trial, name)

    def prepare(self, *objects):
        import torch

        out = [o.to(self.device) if isinstance(o, torch.nn.Module) else o for o in objects]
        return out[0] if len(out) == 1 else tuple(out)

    def steps(self, total):
        return iter(range(total))

    def micro_batches(self, batch):
        yield batch

    def backward(self, loss):
        loss.backward()

    def reduce_mean(self, value, weight=None):
        return float(value)


def trial_params(n: int, seed: int = 0) -> list[dict]:
    """The example's search space, sampled once (RandomSampler) and enqueued in every arm."""
    import gpt2_sweep
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out = []
    for _ in range(n):
        t = study.ask()
        lr, n_embd, n_layer, batch = gpt2_sweep.search_space(t)
        out.append({"lr": lr, "n_embd": n_embd, "n_layer": n_layer, "batch_size": batch})
    return out


def run_arm(arm: str, params: list[dict], devices: str, store: str, log_dir: str) -> dict:
    """One arm in this process (started fresh by ``part_sweep``: each arm pays its own imports)."""
    import gpt2_sweep
    import optuna
    import torch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", pruner=optuna.pruners.NopPruner())
    for p in params:
        study.enqueue_trial(p)
    started = time.time()
    if arm == "plain":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        study.optimize(lambda t: gpt2_sweep.objective(PlainTrial(t, device)), n_trials=len(params), n_jobs=1)
    else:
        from optuna_saturn import SaturnExecutor

        spec = int(devices) if devices.isdigit() else devices
        SaturnExecutor(
            devices=spec,
            strategies=["single", "ddp"],
            profile_store=store,
            log_dir=log_dir,
            progress="quiet",
            dashboard=False,
        ).optimize(study, gpt2_sweep.objective, n_trials=len(params))
    wall = time.time() - started
    trials = []
    for t in study.trials:
        a = {**t.user_attrs, **t.system_attrs}  # (the objective's, and the sweep's records)
        runtime = a.get("saturn:actual_runtime")
        if runtime is None and t.datetime_start and t.datetime_complete:
            runtime = (t.datetime_complete - t.datetime_start).total_seconds()
        trials.append(
            {
                "number": t.number,
                "state": t.state.name,
                "value": t.value,
                "params": t.params,
                "strategy": a.get("saturn:strategy", "plain" if arm == "plain" else None),
                "num_devices": a.get("saturn:num_devices", 1 if arm == "plain" else None),
                "devices": a.get("saturn:devices"),
                "runtime": runtime,
                "startup": (a["saturn:first_step"] - a["saturn:actual_start"])
                if "saturn:first_step" in a and "saturn:actual_start" in a
                else None,
                "planned_runtime": a.get("saturn:planned_runtime"),
                "priced_by": a.get("saturn:priced_by"),
                "fail_reason": a.get("saturn:fail_reason"),
            }
        )
    last = study.user_attrs.get("saturn:last_sweep", {})
    keep = (
        "profiling_device_seconds",
        "profiling_runs",
        "planning_seconds",
        "describing_seconds",
        "idle_device_seconds",
        "makespan",
        "lower_bound",
    )
    return {
        "arm": arm,
        "wall": wall,
        "trials": trials,
        "sweep": {k: last[k] for k in keep if k in last},
        "cuda": torch.cuda.is_available(),
        "max_memory_allocated_mib": (torch.cuda.max_memory_allocated() / 2**20) if torch.cuda.is_available() else None,
    }


def _in_a_process(args: list[str], timeout: float) -> tuple[dict | None, str]:
    """Runs this script with ``args`` in a fresh process (own session: killed as a whole on time-out)."""
    cmd = [sys.executable, "-u", __file__, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the executor stops its pool on SIGTERM
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        return None, f"timed out after {timeout:.0f}s\n{out[-4000:]}"
    result = None
    for line in out.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
    if proc.returncode != 0 or result is None:
        return None, f"exit {proc.returncode}\n{out[-4000:]}"
    return result, out


def _print_arm(r: dict) -> None:
    print(f"  [{r['arm']}] wall {r['wall']:.1f}s  sweep={r['sweep']}  max_mem={r.get('max_memory_allocated_mib')}")
    print(f"    {'#':>2} {'state':8} {'value':>8} {'strategy':12} {'dev':>3} {'runtime':>8} {'start-up':>8}  params")
    for t in r["trials"]:
        value = f"{t['value']:.4f}" if t["value"] is not None else "-"
        rt = f"{t['runtime']:.2f}" if t["runtime"] is not None else "-"
        su = f"{t['startup']:.2f}" if t["startup"] is not None else "-"
        p = t["params"]
        print(
            f"    {t['number']:>2} {t['state']:8} {value:>8} {t['strategy']!s:12} {t['num_devices']!s:>3} "
            f"{rt:>8} {su:>8}  lr={p.get('lr', 0):.2e} n_embd={p.get('n_embd')} n_layer={p.get('n_layer')} "
            f"batch={p.get('batch_size')}" + (f"  FAIL: {t['fail_reason']}" if t.get("fail_reason") else "")
        )


def part_sweep(n_trials: int, devices: str, arms: list[str], budget: float) -> int:
    import gpt2_sweep

    t0 = time.time()
    gpt2_sweep.token_ids()  # the tokenizer and token cache, built once before any arm is timed
    params = trial_params(n_trials)
    store, logs = str(WORK / "profiles"), str(WORK / "runs")
    results: dict[str, dict] = {}
    failures = []
    for i, arm in enumerate(arms):
        left = budget - (time.time() - t0)
        if left < 20:
            failures.append(f"{arm}: skipped, no time left")
            print(f"  [{arm}] SKIPPED: {left:.0f}s left of the part's budget")
            continue
        timeout = left / (len(arms) - i) * (1.6 if i < len(arms) - 1 else 1.0)
        r, out = _in_a_process(
            [
                "arm",
                "--arm",
                "plain" if arm == "plain" else "saturn",
                "--devices",
                devices,
                "--store",
                store,
                "--log-dir",
                logs,
                "--params",
                json.dumps(params),
            ],
            min(timeout, left),
        )
        if r is None:
            failures.append(f"{arm}: {out.splitlines()[0]}")
            print(f"  [{arm}] FAILED: {out}")
            continue
        r["arm"] = arm
        results[arm] = r
        _print_arm(r)
        bad = [t["number"] for t in r["trials"] if t["state"] != "COMPLETE"]
        if bad:
            failures.append(f"{arm}: trials {bad} not COMPLETE")
    summary: dict = {"params": params, "arms": results, "devices": devices}
    if "plain" in results:
        plain = results["plain"]
        for arm, r in results.items():
            if arm == "plain":
                continue
            ratio = r["wall"] / plain["wall"]
            diffs = [
                _rel(a["value"], b["value"])
                for a, b in zip(r["trials"], plain["trials"])
                if a["value"] is not None and b["value"] is not None
            ]
            rt_a = sum(t["runtime"] or 0 for t in r["trials"])
            rt_p = sum(t["runtime"] or 0 for t in plain["trials"])
            summary[f"{arm}/plain"] = {
                "wall_ratio": ratio,
                "runtime_sum_ratio": rt_a / rt_p if rt_p else None,
                "max_rel_value_diff": max(diffs) if diffs else None,
            }
            print(
                f"  RATIO {arm}/plain: wall {r['wall']:.1f}s / {plain['wall']:.1f}s = {ratio:.2f}x; "
                f"sum of trial runtimes {rt_a:.1f}s / {rt_p:.1f}s; "
                f"max rel. diff of values vs plain {max(diffs) if diffs else float('nan'):.2e} (info only: "
                f"GPU kernels are not bit-deterministic)"
            )
    _dump("sweep", summary)
    print(f"PART sweep: {'OK' if not failures else 'FAILED (' + '; '.join(failures) + ')'}")
    return 0 if not failures else 1


# ---------------------------------------------------------------------------------------------------- parity
def part_parity(budget: float) -> int:
    import objectives
    import optuna
    import torch

    from optuna_saturn import SaturnExecutor
    from optuna_saturn.strategy import load_strategies

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0 = time.time()
    folder = WORK / "parity-strategies"
    folder.mkdir(parents=True, exist_ok=True)
    # single with 4 micro-batches per step (same global batch), as tests/test_strategies_real.py's ACCUMULATING
    (folder / "single-accum4.toml").write_text(
        'name = "single-accum4"\nlauncher = "torchrun"\nengine = "single"\nmin_devices = 1\nmax_devices = 1\n'
        "[knobs]\ngradient_accumulation = [4]\n"
    )
    known = load_strategies(folders=[folder])
    names = ["single", "single-ckpt", "single-accum4"]
    one_device_others = [
        n for n, s in known.items() if n not in names and s.min_devices <= 1 and not getattr(s, "one_process", False)
    ]
    skipped = {}
    try:
        import deepspeed  # noqa: F401
    except Exception as e:
        ds = [n for n in one_device_others if known[n].engine == "deepspeed"]
        for n in ds:
            skipped[n] = f"deepspeed not importable ({type(e).__name__})"
        one_device_others = [n for n in one_device_others if n not in ds]
    names += one_device_others
    device = 0 if torch.cuda.is_available() else 1  # CUDA index 0, else one CPU device
    devices = [0] if torch.cuda.is_available() else 1
    results: dict = {}
    failures = []
    for name in names:
        if time.time() - t0 > budget - 15:
            skipped[name] = "no time left"
            continue
        study = optuna.create_study()
        started = time.time()
        try:
            SaturnExecutor(
                devices=devices,
                strategies=[name],
                strategy_folders=[folder],
                log_dir=str(WORK / "parity-runs"),
                grace_period=5,
                profile=False,
                profile_store=str(WORK / "parity-profiles"),
                progress="quiet",
                dashboard=False,
            ).optimize(study, objectives.same_curve, n_trials=1)
        except Exception as e:
            failures.append(f"{name}: {type(e).__name__}: {e}")
            traceback.print_exc()
            continue
        t = study.trials[0]
        results[name] = {
            "state": t.state.name,
            "losses": t.user_attrs.get("losses"),
            "strategy": t.system_attrs.get("saturn:strategy"),
            "facts": t.user_attrs.get("facts"),
            "devices": t.system_attrs.get("saturn:devices"),
            "wall": time.time() - started,
            "fail_reason": t.system_attrs.get("saturn:fail_reason"),
        }
    ref = (results.get("single") or {}).get("losses")
    print(f"  device: {'cuda:0' if device == 0 else 'cpu'}; tolerance rel 1e-4 (tests/test_strategies_real.py)")
    for name, r in results.items():
        losses = r["losses"]
        if r["state"] != "COMPLETE" or not losses:
            failures.append(f"{name}: {r['state']} {r['fail_reason']}")
            print(f"  {name:14} {r['state']}  FAIL: {r['fail_reason']}")
            continue
        worst = max(_rel(a, b) for a, b in zip(losses, ref)) if ref and len(ref) == len(losses) else float("inf")
        ok = worst <= 1e-4 and losses[-1] < losses[0] and r["strategy"] == name
        if not ok:
            failures.append(f"{name}: max rel diff {worst:.2e} (strategy ran: {r['strategy']})")
        print(
            f"  {name:14} {'ok ' if ok else 'BAD'} ran as {r['strategy']} on {r['devices']} in {r['wall']:.1f}s; "
            f"max rel diff vs single {worst:.2e}; losses {losses[0]:.5f} -> {losses[-1]:.5f}; facts {r['facts']}"
        )
    for name, why in skipped.items():
        print(f"  {name:14} SKIPPED: {why}")
    _dump("parity", {"results": results, "skipped": skipped, "failures": failures})
    print(f"PART parity: {'OK' if not failures else 'FAILED (' + '; '.join(failures) + ')'}")
    return 0 if not failures else 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=["env", "sweep", "parity", "arm"])
    ap.add_argument("--n-trials", type=int, default=int(os.environ.get("GPU_CHECK_TRIALS", "8")))
    ap.add_argument("--devices", default=os.environ.get("GPU_CHECK_DEVICES", "auto"))
    ap.add_argument("--arms", default=os.environ.get("GPU_CHECK_ARMS", "plain,cold,warm"))
    ap.add_argument("--budget", type=float, default=240.0, help="seconds for the part (a soft limit)")
    ap.add_argument("--arm")
    ap.add_argument("--store")
    ap.add_argument("--log-dir")
    ap.add_argument("--params")
    a = ap.parse_args()
    if a.part == "arm":
        print(
            "RESULT " + json.dumps(run_arm(a.arm, json.loads(a.params), a.devices, a.store, a.log_dir), default=str),
            flush=True,
        )
        return
    try:
        rc = {
            "env": part_env,
            "sweep": lambda: part_sweep(a.n_trials, a.devices, a.arms.split(","), a.budget),
            "parity": lambda: part_parity(a.budget),
        }[a.part]()
    except Exception as e:
        traceback.print_exc()
        print(f"PART {a.part}: FAILED ({type(e).__name__}: {e})")
        rc = 1
    sys.exit(rc)


if __name__ == "__main__":
    main()
