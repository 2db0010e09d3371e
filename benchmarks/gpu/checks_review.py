"""The GPU review's checks C0-C8 (../shared/notes/gpu-review.md; issue 36; C8, stop 44), each a function that
prints its ``CHECK`` lines and returns False when one FAILs. ``review_checks.py`` runs each in a fresh process.

- C0: versions, the GPUs, /dev/shm, the kernel (gVisor shows 4.4.0), and whether DeepSpeed imports.
- C1: fork safety, host to workers: what initialises CUDA in a process (probes, each a fresh process), and a
  ``transformers.Trainer`` objective through the executor (its host warms it up before forking workers).
- C2: one warm worker over 12 trials: memory left between jobs (cuBLAS's workspaces cleared first), where each
  trial ran (its mask, ``LOCAL_RANK``, its current device), threads, file descriptors, device memory in use (and
  ZeRO-3 with offload over 3 trials).
- C3: 50 NCCL process groups made and destroyed in one process: free memory, threads, descriptors.
- C4: a ZeRO-2 engine's memory after its run lets go of it; and ``LOCAL_RANK`` as DeepSpeed reads it.
- C5: out of memory in the steps: the profile tries more micro-batches; a trial that ran out is planned again.
- C6: a killed worker's memory against the next job on its GPU.
- C7: the CPU threads of a GPU worker (an offloaded optimizer step runs there).
- C8: a DDP trial whose rank 1's worker is killed (kill -9) mid-run: its rank 0 loses the peer (NCCL's "remote
  process exited", gloo's "connection reset by peer"), and the trial runs again from its checkpoint, not FAIL for
  good (stop 44). Needs two GPUs (two CPU devices over gloo in the dry run).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from checks_common import (
    DRY,
    check,
    cuda,
    deepspeed_import,
    executor,
    expected_entry,
    part_work,
    placement_problems,
    smi,
    used_mib,
    without_deepspeed,
)

#: Memory a warm worker's GPU may hold reserved as a trial starts: cuBLAS's workspaces (32 MiB on sm90 per handle
#: and stream, ``CUBLAS_WORKSPACE_CONFIG=:4096:8``; cuBLASLt's beside it), which the allocator keeps cached once
#: they are cleared. What is still *allocated* after ``_cuda_clearCublasWorkspaces`` must be 0.
RESERVED_TOLERANCE = 64 * 2**20


def leftover_problems(entries: list[dict]) -> list[str]:
    """What the trials after the first found still held as they began (each trial records it from inside itself,
    see review_objectives._entry_facts): any allocated byte once cuBLAS's workspaces are cleared, or more than
    ``RESERVED_TOLERANCE`` reserved."""
    problems = []
    for i, entry in enumerate(entries[1:], start=1):
        allocated, reserved = entry.get("alloc0", -1), entry.get("reserved0", -1)
        if allocated != 0 or not 0 <= reserved <= RESERVED_TOLERANCE:
            problems.append(f"trial {i}: {allocated} bytes allocated, {reserved} reserved")
    return problems


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
    check("C0", "INFO", json.dumps(facts))
    found = deepspeed_import()  # (an installed DeepSpeed that does not import fails here, and in each of its parts)
    verdict = {"ok": "PASS", "absent": "SKIP", "broken": "FAIL"}[found["state"]]
    return check("C0", verdict, f"import deepspeed: {found['state']} {found['reason']}".rstrip())


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
#: The one probe a dry run makes (no CUDA on a CPU: every probe shows the same; this one runs the probes' code).
DRY_PROBE = "f is_available() by NVML"


def c1() -> bool:
    ok = True
    tail = (
        "\nimport sys, torch\nfrom optuna_saturn.pools.forked_host import cuda_driver_loaded\n"
        "print('RESULT', torch.cuda.is_initialized(), cuda_driver_loaded())"
    )
    running = {}  # (the probes at once: each is a fresh interpreter that imports torch)
    # (each probe without the NVML variable this process set, unless the probe names it)
    base = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    for name, (env, code) in PROBES.items():
        if DRY and name != DRY_PROBE:
            continue
        if name.startswith("e") and without_deepspeed("C1", f"probe {name}") is not None:
            ok &= deepspeed_import()["state"] != "broken"
            continue
        running[name] = subprocess.Popen(
            [sys.executable, "-c", code.format(tmp=part_work("C1") / "probe") + tail],
            env={**base, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
    import optuna
    import review_objectives

    if DRY:
        os.environ["REVIEW_STEPS"] = "4"
    study = optuna.create_study()  # (while the probes run)
    study.enqueue_trial({"lr": 1e-3})
    executor("C1", strategies=["single"], profile=False, max_retries=0).optimize(
        study, review_objectives.trainer_gpt2, n_trials=1
    )
    trial = study.trials[0]
    host_log = "".join(
        Path(p).read_text() for p in glob.glob(str(part_work("C1") / "runs" / "*" / "workers" / "pool-host.log"))
    )
    fresh = "fresh interpreters" in host_log
    ok &= check(
        "C1",
        "PASS" if trial.state.name == "COMPLETE" else "FAIL",
        f"Trainer objective through the executor: {trial.state.name} "
        f"{trial.system_attrs.get('saturn:fail_reason', '')} (workers {'started fresh' if fresh else 'forked'})",
    )
    for name, probe in running.items():
        out, _ = probe.communicate(timeout=120)
        result = next((line for line in out.splitlines() if line.startswith("RESULT")), "RESULT error")
        initialised, driver = [*result.split()[1:], "?", "?"][:2]
        clean = initialised == "False" and driver == "False"
        verdict = ("PASS" if clean else "FAIL") if name in MUST_STAY_CLEAN else "INFO"
        ok &= check("C1", verdict, f"probe {name}: cuda initialised={initialised}, driver loaded={driver}")
    return ok


# -- C2 ---------------------------------------------------------------------------------------------------------
def c2() -> bool:
    import optuna
    import review_objectives

    ok = True
    n = 12 if not DRY else 4
    if DRY:
        os.environ.update(REVIEW_WIDTH="64", REVIEW_STEPS="5")
    study = optuna.create_study()
    for _ in range(n):
        study.enqueue_trial({"lr": 3e-4})
    # (profiled on a GPU, as a sweep runs; not in the dry run, which has no time for it)
    executor("C2", strategies=["single", "single-ckpt"], profile=not DRY).optimize(
        study, review_objectives.warm_worker, n_trials=n
    )
    entries = [t.user_attrs.get("entry", {}) for t in study.trials]
    samples = [{k: e.get(k) for k in ("used_mib", "os_threads", "fds")} for e in entries]  # (as each trial began)
    complete = all(t.state.name == "COMPLETE" for t in study.trials)
    pids = {e.get("pid") for e in entries}
    leftover = leftover_problems(entries)
    misplaced = placement_problems(entries, expected_entry(0))
    flat = samples[2]["os_threads"] == samples[-1]["os_threads"] and abs(samples[2]["fds"] - samples[-1]["fds"]) <= 2
    memory = (
        samples[-1]["used_mib"] - samples[2]["used_mib"] if samples and samples[-1]["used_mib"] is not None else None
    )
    ok &= check("C2", "PASS" if complete else "FAIL", f"{n} trials on one warm worker: all COMPLETE={complete}")
    ok &= check("C2", "PASS" if len(pids) == 1 else "FAIL", f"worker pids {sorted(map(str, pids))}")
    held = {(e.get("alloc_raw"), e.get("reserved_raw"), e.get("alloc0"), e.get("reserved0")) for e in entries[1:]}
    ok &= check(
        "C2",
        "FAIL" if leftover else "PASS",
        f"memory held at each later trial's start (allocated, reserved; then allocated, reserved once cuBLAS's "
        f"workspaces are cleared): {sorted(held, key=str)} {'; '.join(leftover)}",
    )
    ok &= check(
        "C2",
        "FAIL" if misplaced else "PASS",
        f"each trial's mask {entries[0].get('visible')!r} (its pool entry {expected_entry(0)!r}), LOCAL_RANK "
        f"{entries[0].get('local_rank_env')!r}, current device {entries[0].get('current_device')} "
        f"{'; '.join(misplaced[:3])}",
    )
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
    cannot = without_deepspeed("C2", "zero3-offload")
    if cannot is not None:
        return ok and cannot
    os.environ.update(REVIEW_WIDTH="64" if DRY else "4096", REVIEW_DEPTH="4", REVIEW_STEPS="5")
    zero = optuna.create_study()
    for _ in range(3):
        zero.enqueue_trial({"lr": 3e-4})
    executor("C2", strategies=["zero3-offload"], profile=False).optimize(
        zero, review_objectives.warm_worker, n_trials=3
    )
    entries = [t.user_attrs.get("entry", {}) for t in zero.trials]
    states = {t.state.name for t in zero.trials}
    problems = leftover_problems(entries) + placement_problems(entries, expected_entry(0))
    return ok & check(
        "C2", "PASS" if states == {"COMPLETE"} and not problems else "FAIL", f"zero3-offload: {states} {problems}"
    )


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
        place = join_process_group(device, 0, 1, init_method=f"file://{part_work('C3')}/rdv-{i}", rendezvous_timeout=60)
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
    cannot = without_deepspeed("C4", "a ZeRO-2 engine's release")
    if cannot is not None:
        return cannot
    import gc
    import weakref

    import torch

    from optuna_saturn.engines import WorkerContext
    from optuna_saturn.engines._deepspeed import DeepSpeedEngine
    from optuna_saturn.pools.launch_commands import extensions_cache
    from optuna_saturn.strategy import load_strategies
    from optuna_saturn.worker.gpu import LEFTOVER_BYTES
    from optuna_saturn.worker.memory import collect, release_memory
    from optuna_saturn.worker.rank import join_process_group, leave_process_group

    # (the ops the pool's workers use, built before a pool's first ZeRO job: C2's; torch's default folder would
    # build them again, in this part)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(extensions_cache()))
    kind = "cuda" if cuda() else "cpu"
    place = join_process_group(
        {"kind": kind, "index": 0, "cores": [], "node": ""}, 0, 1, init_method=f"file://{part_work('C4')}/rdv"
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
        deepspeed.init_distributed(
            dist_init_required=True, init_method=f"file://{part_work('C4')}/rdv-b", rank=0, world_size=1
        )
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
    study = executor("C5", strategies=["single"]).profile(
        review_objectives.activations_of_160_gb, params=[{"lr": 3e-4}]
    )
    records = {
        r.gradient_accumulation: r
        for r in ProfileStore(part_work("C5") / "profiles").records()
        if r.strategy == "single"
    }
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
    executor("C5", strategies=["single"], profile_store=part_work("C5") / "profiles-trial").optimize(
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
    executor("C6", profile=False, stall_timeout=3, max_retries=0, grace_period=1).optimize(
        study, review_objectives.hog_or_grab, n_trials=2
    )
    stop.set()
    poller.join()
    hog, grab = study.trials
    waited = [
        line.strip()
        for path in glob.glob(str(part_work("C6") / "runs" / "*" / "workers" / "worker-*.log"))
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

    if DRY:
        os.environ["REVIEW_PARAMS"] = str(5_000_000)
    study = optuna.create_study()
    executor("C7", profile=False).optimize(study, review_objectives.cpu_threads, n_trials=1)
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
            f"AdamW step over {int(os.environ.get('REVIEW_PARAMS', 50_000_000)) // 10**6} M CPU parameters: "
            f"{many} s at {threads} threads, {one} s at 1 ({one / many:.1f}x)",
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
    if DRY:
        os.environ["REVIEW_STEPS"] = "24"  # (killed at step 10 or later, and run again from there)
    storage = f"sqlite:///{part_work('C8') / 'c8.sqlite3'}"
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
    executor("C8", devices=devices, strategies=["ddp"], profile=False, max_retries=1).optimize(
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
