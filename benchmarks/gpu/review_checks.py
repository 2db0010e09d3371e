"""The GPU review's checks in one go (../shared/notes/gpu-review.md, parts C0-C7; issue 36; C8, stop 44), on one GPU.

    python benchmarks/gpu/review_checks.py [--parts C0,C1,...] [--budget 540] [--dry]

Each part runs in a fresh process under its own time limit (the whole run stays under ``--budget`` seconds) and
prints ``CHECK <id>: PASS|FAIL|INFO|SKIP <numbers>`` lines; a summary of them ends the run, and the exit code is
non-zero if any part failed. ``--dry`` runs on a machine without a GPU: every part does what it can on a CPU
device (the environment, the fork probes, the warm worker's leaks, process groups over gloo, the engine's
release, out-of-memory recovery on simulated rows, CPU threads) with small sizes, and what needs a GPU says SKIP;
tests/test_gpu_check_script.py runs it so.

- C0: versions, the GPUs, /dev/shm, the kernel (gVisor shows 4.4.0).
- C1: fork safety, host to workers: what initialises CUDA in a process (probes, each a fresh process), and a
  ``transformers.Trainer`` objective through the executor (its host warms it up before forking workers).
- C2: one warm worker over 20 trials: memory left between jobs, the device it runs on, ``LOCAL_RANK``, threads,
  file descriptors, device memory in use (and ZeRO-3 with offload over 6 trials, if DeepSpeed is installed).
- C3: 50 NCCL process groups made and destroyed in one process: free memory, threads, descriptors.
- C4: a ZeRO-2 engine's memory after its run lets go of it; and ``LOCAL_RANK`` as DeepSpeed reads it.
- C5: out of memory in the steps: the profile tries more micro-batches; a trial that ran out is planned again.
- C6: a killed worker's memory against the next job on its GPU.
- C7: the CPU threads of a GPU worker (an offloaded optimizer step runs there).
- C8: a DDP trial whose rank 1's worker is killed (kill -9) mid-run: its rank 0 loses the peer (NCCL's "remote
  process exited", gloo's "connection reset by peer"), and the trial runs again from its checkpoint, not FAIL for
  good (stop 44). Needs two GPUs (one in --dry: two CPU devices over gloo).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parent.parent / "examples"):
    sys.path.insert(0, str(path))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
WORK = Path(os.environ.get("GPU_CHECK_WORK", tempfile.gettempdir() + "/gpu-review"))
DRY = os.environ.get("REVIEW_DRY") == "1"


def check(part: str, verdict: str, text: str = "") -> bool:
    print(f"CHECK {part}: {verdict}{' ' + text if text else ''}", flush=True)
    return verdict != "FAIL"


def cuda() -> bool:
    import torch

    return torch.cuda.is_available() and not DRY


def executor(**options):
    from optuna_saturn import SaturnExecutor

    defaults = {
        "devices": [0] if cuda() else 1,
        "log_dir": WORK / "runs",
        "profile_store": WORK / "profiles",
        "progress": "quiet",
        "dashboard": False,
        "grace_period": 2,
    }
    return SaturnExecutor(**{**defaults, **options})


def smi(query: str) -> list[str]:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        return [line.strip() for line in out.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError):
        return []


def used_mib() -> float | None:
    values = smi("memory.used")
    return float(values[0]) if values else None


# -- C0 ---------------------------------------------------------------------------------------------------------
def c0() -> bool:
    import importlib.metadata as md

    import torch

    facts = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": torch.cuda.device_count()}
    if torch.cuda.is_available():
        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    for name in ("transformers", "accelerate", "deepspeed", "optuna", "optuna-saturn", "nvidia-ml-py"):
        try:
            facts[name] = md.version(name)
        except md.PackageNotFoundError:
            facts[name] = None
    facts["smi"] = smi("name,memory.total,memory.used,compute_mode")
    shm = shutil.disk_usage("/dev/shm") if os.path.exists("/dev/shm") else None
    facts["dev_shm_gib"] = round(shm.total / 2**30, 2) if shm else None
    facts["kernel"] = os.uname().release + (" (gVisor)" if os.uname().release.startswith("4.4.0") else "")
    return check("C0", "INFO", json.dumps(facts))


# -- C1 ---------------------------------------------------------------------------------------------------------
PROBES = {
    "a import torch": ({}, "import torch"),
    "b import accelerate, transformers": ({}, "import torch, accelerate, transformers"),
    "c TrainingArguments": (
        {},
        "from transformers import TrainingArguments; TrainingArguments(output_dir='{tmp}', "
        "report_to=[], use_cpu=False).device",
    ),
    "d TrainingArguments while described": (
        {},
        "from optuna_saturn.profiler._without_gpus import without_gpus\nwith without_gpus():\n"
        "    from transformers import TrainingArguments; TrainingArguments(output_dir='{tmp}', report_to=[]).device",
    ),
    "e1 import deepspeed": ({}, "import deepspeed"),
    "e2 import deepspeed, accelerator named": (
        {"DS_ACCELERATOR": "cuda", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"},
        "import deepspeed",
    ),
    "f is_available() by NVML": ({"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}, "import torch; torch.cuda.is_available()"),
}
#: The probes whose process must not initialise CUDA: what the fixes rely on.
MUST_STAY_CLEAN = (
    "d TrainingArguments while described",
    "e2 import deepspeed, accelerator named",
    "f is_available() by NVML",
)


def c1() -> bool:
    ok = True
    tail = (
        "\nimport sys, torch\nfrom optuna_saturn.pools.forked_host import cuda_driver_loaded\n"
        "print('RESULT', torch.cuda.is_initialized(), cuda_driver_loaded())"
    )
    running = {}  # (the probes at once: each is a fresh interpreter that imports torch)
    for name, (env, code) in PROBES.items():
        if name.startswith("e") and not installed("deepspeed"):
            check("C1", "SKIP", f"probe {name}: DeepSpeed is not installed")
            continue
        running[name] = subprocess.Popen(
            [sys.executable, "-c", code.format(tmp=WORK / "probe") + tail],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
    for name, probe in running.items():
        out, _ = probe.communicate(timeout=120)
        result = next((line for line in out.splitlines() if line.startswith("RESULT")), "RESULT error")
        initialised, driver = [*result.split()[1:], "?", "?"][:2]
        clean = initialised == "False" and driver == "False"
        verdict = ("PASS" if clean else "FAIL") if name in MUST_STAY_CLEAN else "INFO"
        ok &= check("C1", verdict, f"probe {name}: cuda initialised={initialised}, driver loaded={driver}")
    import hf_trainer_sweep
    import optuna

    study = optuna.create_study()
    executor(strategies=["single"], profile=False, max_retries=0).optimize(
        study, hf_trainer_sweep.objective, n_trials=1
    )
    trial = study.trials[0]
    host_log = "".join(Path(p).read_text() for p in glob.glob(str(WORK / "runs" / "*" / "workers" / "pool-host.log")))
    fresh = "fresh interpreters" in host_log
    ok &= check(
        "C1",
        "PASS" if trial.state.name == "COMPLETE" else "FAIL",
        f"Trainer objective through the executor: {trial.state.name} "
        f"{trial.system_attrs.get('saturn:fail_reason', '')} (workers {'started fresh' if fresh else 'forked'})",
    )
    return ok


def installed(module: str) -> bool:
    """Without importing it (DeepSpeed's import may probe the GPU, which the executor's process must not)."""
    import importlib.util

    return importlib.util.find_spec(module) is not None


# -- C2 ---------------------------------------------------------------------------------------------------------
def c2() -> bool:
    import optuna
    import review_objectives

    ok = True
    n = 20 if not DRY else 4
    if DRY:
        os.environ.update(REVIEW_WIDTH="64", REVIEW_STEPS="5")
    study = optuna.create_study()
    for _ in range(n):
        study.enqueue_trial({"lr": 3e-4})
    executor(strategies=["single", "single-ckpt"]).optimize(study, review_objectives.warm_worker, n_trials=n)
    entries = [t.user_attrs.get("entry", {}) for t in study.trials]
    samples = [{k: e.get(k) for k in ("used_mib", "os_threads", "fds")} for e in entries]  # (as each trial began)
    complete = all(t.state.name == "COMPLETE" for t in study.trials)
    pids = {e.get("pid") for e in entries}
    leftover = [e.get("alloc0", -1) for e in entries[1:]] + [e.get("reserved0", -1) for e in entries[1:]]
    bound = {(e.get("current_device"), e.get("local_rank_env")) for e in entries}
    flat = samples[2]["os_threads"] == samples[-1]["os_threads"] and abs(samples[2]["fds"] - samples[-1]["fds"]) <= 2
    memory = (
        samples[-1]["used_mib"] - samples[2]["used_mib"] if samples and samples[-1]["used_mib"] is not None else None
    )
    ok &= check("C2", "PASS" if complete else "FAIL", f"{n} trials on one warm worker: all COMPLETE={complete}")
    ok &= check("C2", "PASS" if len(pids) == 1 else "FAIL", f"worker pids {sorted(map(str, pids))}")
    ok &= check(
        "C2", "PASS" if not any(leftover) else "FAIL", f"memory held at each later trial's start: {set(leftover)}"
    )
    expected = {(0 if cuda() else -1, "0")}
    ok &= check("C2", "PASS" if bound == expected else "FAIL", f"(current device, LOCAL_RANK) seen: {bound}")
    ok &= check("C2", "PASS" if flat else "FAIL", f"threads and fds from trial 3 to {n}: {samples[2]} -> {samples[-1]}")
    if memory is not None:
        ok &= check(
            "C2", "PASS" if abs(memory) <= 64 else "FAIL", f"device memory in use, trial 3 to {n}: {memory:+.0f} MiB"
        )
    starts = [
        t.system_attrs["saturn:objective_start"] - t.system_attrs["saturn:actual_start"] for t in study.trials[:2]
    ]
    check(
        "C2",
        "INFO",
        f"threads {entries[0].get('threads')}; visible {entries[0].get('visible')}; job start to objective, 1st "
        f"and 2nd job: {starts[0]:.2f} s, {starts[1]:.2f} s",
    )
    if installed("deepspeed"):
        os.environ.update(REVIEW_WIDTH="64" if DRY else "4096", REVIEW_DEPTH="4", REVIEW_STEPS="5")
        zero = optuna.create_study()
        for _ in range(3 if DRY else 6):
            zero.enqueue_trial({"lr": 3e-4})
        executor(strategies=["zero3-offload"], profile=False).optimize(
            zero, review_objectives.warm_worker, n_trials=3 if DRY else 6
        )
        held = [t.user_attrs.get("entry", {}).get("alloc0", -1) for t in zero.trials[1:]]
        states = {t.state.name for t in zero.trials}
        ok &= check(
            "C2",
            "PASS" if states == {"COMPLETE"} and not any(held) else "FAIL",
            f"zero3-offload: {states}, held {held}",
        )
    else:
        check("C2", "SKIP", "zero3-offload: DeepSpeed is not installed")
    return ok


# -- C3 ---------------------------------------------------------------------------------------------------------
def c3() -> bool:
    import torch
    import torch.distributed as dist

    from optuna_saturn.worker.memory import release_memory
    from optuna_saturn.worker.rank import join_process_group, leave_process_group

    device = {"kind": "cuda" if cuda() else "cpu", "index": 0, "cores": [], "node": ""}
    size = (16 << 20) if cuda() else (1 << 16)
    free, threads, fds, inits, destroys = [], [], [], [], []
    for i in range(50 if not DRY else 10):
        started = time.perf_counter()
        place = join_process_group(device, 0, 1, init_method=f"file://{WORK}/rdv-{i}", rendezvous_timeout=60)
        group = dist.new_group(ranks=[0])  # (as DeepSpeed's clone of the world)
        inits.append(time.perf_counter() - started)
        dist.all_reduce(torch.ones(size, device=place.device))
        dist.all_reduce(torch.ones(size, device=place.device), group=group)
        started = time.perf_counter()
        leave_process_group(place)
        release_memory(place.device)
        destroys.append(time.perf_counter() - started)
        free.append(torch.cuda.mem_get_info()[0] / 2**20 if cuda() else 0.0)
        threads.append(len(os.listdir("/proc/self/task")))
        fds.append(len(os.listdir("/proc/self/fd")))
    steady = max(free[2:]) - min(free[2:])
    ok = check(
        "C3", "PASS" if steady <= 32 else "FAIL", f"free memory over cycles 3-{len(free)}: spread {steady:.0f} MiB"
    )
    ok &= check(
        "C3",
        "PASS" if max(threads[2:]) - min(threads[2:]) <= 2 and max(fds[2:]) - min(fds[2:]) <= 2 else "FAIL",
        f"threads {threads[2]}->{threads[-1]}, fds {fds[2]}->{fds[-1]}",
    )
    check(
        "C3",
        "INFO",
        f"process group made in {statistics.median(inits):.3f} s, destroyed in "
        f"{statistics.median(destroys):.3f} s (medians)",
    )
    return ok


# -- C4 ---------------------------------------------------------------------------------------------------------
def c4() -> bool:
    if not installed("deepspeed"):
        return check("C4", "SKIP", "DeepSpeed is not installed")
    import gc
    import weakref

    import torch

    from optuna_saturn.engines import WorkerContext
    from optuna_saturn.engines._deepspeed import DeepSpeedEngine
    from optuna_saturn.strategy import load_strategies
    from optuna_saturn.worker.gpu import LEFTOVER_BYTES
    from optuna_saturn.worker.memory import collect, release_memory
    from optuna_saturn.worker.rank import join_process_group, leave_process_group

    kind = "cuda" if cuda() else "cpu"
    place = join_process_group(
        {"kind": kind, "index": 0, "cores": [], "node": ""}, 0, 1, init_method=f"file://{WORK}/rdv-c4"
    )
    zero2 = load_strategies()["zero2"]
    context = WorkerContext(
        0, 0, 1, place.device, dict(zero2.knobs), dict(zero2.launcher_config), 1, place.control_group, "zero2"
    )
    engine = DeepSpeedEngine(context)
    width = 4096 if cuda() else 256
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(12 if cuda() else 2)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    prepared, stepper = engine.prepare_model_and_optimizer(model, optimizer)
    for _ in range(3):
        loss = prepared(torch.randn(64, width, device=place.device)).pow(2).mean()
        engine.backward(loss, prepared)
        stepper.step()
    watch = weakref.ref(prepared)
    del model, optimizer, prepared, stepper, loss
    engine.release()
    collect(place.device)
    release_memory(place.device)
    held = torch.cuda.memory_allocated() if cuda() else 0
    gone = watch() is None
    ok = check(
        "C4",
        "PASS" if gone and held < LEFTOVER_BYTES else "FAIL",
        f"after its run let go: engine collected={gone}, {held / 2**20:.0f} MiB still allocated",
    )
    leave_process_group(place)
    gc.collect()
    if not cuda():
        return ok and check("C4", "SKIP", "LOCAL_RANK as DeepSpeed reads it: needs a GPU")
    import deepspeed

    os.environ["LOCAL_RANK"] = "1"  # what rank 1 of a job whose actor sees one GPU was given before issue 36
    try:
        deepspeed.init_distributed(dist_init_required=True, init_method=f"file://{WORK}/rdv-c4b", rank=0, world_size=1)
        deepspeed.initialize(model=torch.nn.Linear(8, 8), config={"train_batch_size": 1}, dist_init_required=False)
        check("C4", "INFO", "LOCAL_RANK=1 with one GPU in sight: initialised (no invalid device ordinal)")
    except Exception as exc:
        check("C4", "INFO", f"LOCAL_RANK=1 with one GPU in sight: {type(exc).__name__}: {str(exc)[:120]} (issue 36 #1)")
    os.environ["LOCAL_RANK"] = "0"  # what every rank sees now
    try:
        engine0, *_ = deepspeed.initialize(model=torch.nn.Linear(8, 8), config={"train_batch_size": 1})
        ok &= check(
            "C4", "PASS" if str(engine0.device) == "cuda:0" else "FAIL", f"LOCAL_RANK=0: engine on {engine0.device}"
        )
    except Exception as exc:
        ok &= check("C4", "FAIL", f"LOCAL_RANK=0: {type(exc).__name__}: {exc}")
    return ok


# -- C5 ---------------------------------------------------------------------------------------------------------
def c5() -> bool:
    import optuna
    import review_objectives

    from optuna_saturn.profiler import ProfileStore

    if DRY:  # (no out of memory on CPU: a real run of the objective, small)
        os.environ.update(REVIEW_ROWS="4096", REVIEW_STEPS="3")
    study = executor(strategies=["single"]).profile(review_objectives.activations_of_160_gb, params=[{"lr": 3e-4}])
    records = {r.gradient_accumulation: r for r in ProfileStore(WORK / "profiles").records() if r.strategy == "single"}
    first = records.get(1)
    fitted = [a for a, r in sorted(records.items()) if r.feasible]
    ok = True
    if cuda():
        ok &= check(
            "C5",
            "PASS"
            if first is not None and not first.feasible and first.more_micro_batches_may_fit and fitted
            else "FAIL",
            f"profile: 1 micro-batch {'out of memory in the steps' if first and not first.feasible else first}; "
            f"fits at {fitted}",
        )
    trials = optuna.create_study()
    trials.enqueue_trial({"lr": 3e-4})
    executor(strategies=["single"], profile_store=WORK / "profiles-c5").optimize(
        trials, review_objectives.activations_of_160_gb, n_trials=1
    )
    trial = trials.trials[0]
    accumulation = trial.system_attrs.get("saturn:gradient_accumulation")
    ok &= check(
        "C5",
        "PASS" if trial.state.name == "COMPLETE" and len(trials.trials) == 1 else "FAIL",
        f"a trial run as it was: {trial.state.name} with {accumulation} micro-batch(es), "
        f"{len(trials.trials)} trial(s) {trial.system_attrs.get('saturn:fail_reason', '')}",
    )
    if fitted and study.trials:
        peak = records[fitted[0]].peak_memory_bytes or 0
        check(
            "C5",
            "INFO",
            f"profiled peak {peak / 2**30:.1f} GiB at {fitted[0]} micro-batches; device in use now {used_mib()} MiB",
        )
    return ok


# -- C6 ---------------------------------------------------------------------------------------------------------
def c6() -> bool:
    if not cuda():
        return check("C6", "SKIP", "a killed worker's GPU memory: needs a GPU")
    import optuna
    import review_objectives

    polled: list[tuple[float, float | None]] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            polled.append((time.time(), used_mib()))
            time.sleep(0.1)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    study = optuna.create_study()
    study.enqueue_trial({"mode": "hog"})
    study.enqueue_trial({"mode": "grab"})
    executor(profile=False, stall_timeout=3, max_retries=0, grace_period=1).optimize(
        study, review_objectives.hog_or_grab, n_trials=2
    )
    stop.set()
    poller.join()
    hog, grab = study.trials
    waited = [
        line.strip()
        for path in glob.glob(str(WORK / "runs" / "*" / "workers" / "worker-*.log"))
        for line in Path(path).read_text().splitlines()
        if "waited" in line and "memory" in line
    ]
    ok = check(
        "C6",
        "PASS" if grab.state.name == "COMPLETE" else "FAIL",
        f"hog {hog.state.name}, grab {grab.state.name} {grab.system_attrs.get('saturn:fail_reason', '')}",
    )
    peak = max((u for _, u in polled if u is not None), default=None)
    check("C6", "INFO", f"device memory peak {peak} MiB; the replacement: {waited[-1] if waited else 'no wait needed'}")
    return ok


# -- C7 ---------------------------------------------------------------------------------------------------------
def c7() -> bool:
    import optuna
    import review_objectives

    study = optuna.create_study()
    executor(profile=False).optimize(study, review_objectives.cpu_threads, n_trials=1)
    trial = study.trials[0]
    threads = trial.user_attrs.get("entry", {}).get("threads")
    timings = trial.user_attrs.get("adamw_step_seconds", {})
    cores, pinned = len(os.sched_getaffinity(0)), trial.user_attrs.get("entry", {}).get("cores")
    expected = min(cores, pinned or cores)  # (one device in this pool: its share is every core, near its GPU)
    ok = check(
        "C7",
        "PASS" if threads == expected else "FAIL",
        f"worker threads {threads} (cores {cores}, the worker's near its GPU {pinned})",
    )
    one, many = timings.get("1"), timings.get(str(threads))
    if one and many:
        check(
            "C7",
            "INFO",
            f"AdamW step over 50 M CPU parameters: {many} s at {threads} threads, {one} s at 1 ({one / many:.1f}x)",
        )
    return ok


# -- C8 ---------------------------------------------------------------------------------------------------------
def c8() -> bool:
    import optuna
    import psutil
    import review_objectives
    import torch

    if not DRY and torch.cuda.device_count() < 2:
        return check("C8", "SKIP", "a killed DDP rank under NCCL: needs two GPUs")
    storage = f"sqlite:///{WORK / 'c8.sqlite3'}"
    study = optuna.create_study(study_name="c8", storage=storage)
    study.enqueue_trial({})

    def kill_rank_1_once_checkpointed() -> None:
        watched = optuna.load_study(study_name="c8", storage=storage)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            trials = watched.get_trials(deepcopy=False)
            if trials and (trials[0].system_attrs.get("saturn:checkpoint") or {}).get("step", 0) >= 10:
                for process in psutil.Process().children(recursive=True):
                    if process.name() == "saturn-worker-1":
                        process.kill()
                        return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_rank_1_once_checkpointed, daemon=True)
    killer.start()
    devices = 2 if DRY else [0, 1]
    executor(devices=devices, strategies=["ddp"], profile=False, max_retries=1).optimize(
        study, review_objectives.ddp_checkpointed, n_trials=1
    )
    killer.join(timeout=5)
    trials = optuna.load_study(study_name="c8", storage=storage).trials
    states = [t.state.name for t in trials]
    again = trials[-1].system_attrs if len(trials) > 1 else {}
    ok = check(
        "C8",
        "PASS" if states == ["FAIL", "COMPLETE"] and again.get("saturn:resumed_from_step", 0) >= 10 else "FAIL",
        f"states {states}; the first run's reason: {trials[0].system_attrs.get('saturn:fail_reason', '')[:160]}; "
        f"the run again resumed from step {again.get('saturn:resumed_from_step')}",
    )
    return ok


PARTS: dict[str, tuple[Callable[[], bool], int]] = {
    "C0": (c0, 30),
    "C1": (c1, 120),
    "C2": (c2, 120),
    "C3": (c3, 45),
    "C4": (c4, 60),
    "C5": (c5, 120),
    "C6": (c6, 60),
    "C7": (c7, 40),
    "C8": (c8, 90),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--budget", type=float, default=540.0, help="seconds for every part together")
    parser.add_argument("--dry", action="store_true", help="no GPU: what each part can do on a CPU device")
    parser.add_argument("--part", help=argparse.SUPPRESS)  # (one part, in this fresh process)
    args = parser.parse_args()
    if args.dry:
        os.environ["REVIEW_DRY"] = "1"
    if args.part:
        WORK.mkdir(parents=True, exist_ok=True)
        sys.exit(0 if PARTS[args.part][0]() else 1)
    shutil.rmtree(WORK, ignore_errors=True)
    started, lines, failed = time.monotonic(), [], []
    for name in args.parts.split(","):
        left = args.budget - (time.monotonic() - started)
        limit = min(PARTS[name][1], left)
        if limit < 10:
            lines.append(f"CHECK {name}: SKIP (the budget is spent)")
            continue
        print(f"===== {name} (limit {limit:.0f} s)", flush=True)
        try:
            done = subprocess.run(
                [sys.executable, __file__, "--part", name], timeout=limit, capture_output=True, text=True
            )
            output, code = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as exc:
            output, code = (
                (exc.stdout or b"").decode(errors="replace") + f"\nCHECK {name}: FAIL (timed out after {limit:.0f} s)",
                1,
            )
        print(output[-6000:], flush=True)
        lines += [line for line in output.splitlines() if line.startswith("CHECK ")]
        if code != 0:
            failed.append(name)
    print(f"===== SUMMARY ({time.monotonic() - started:.0f} s)")
    print("\n".join(lines))
    print(f"FAILED: {', '.join(failed)}" if failed else "every part passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
