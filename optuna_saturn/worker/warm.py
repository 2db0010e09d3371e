"""A warm worker: one process per device that runs job after job.

Forked by the pool host (:mod:`optuna_saturn.pools.warm_host`) once torch, optuna-saturn and the objective's module
are imported (:func:`prepare_process`), it pins itself to its device (:func:`serve`); then each job costs a
process group (a new file rendezvous each time), not a process start. Between jobs nothing of the last one
survives: the process group is destroyed, DeepSpeed's and Accelerate's process-wide state is reset, and the
random generators, default dtype, environment, working folder and backend flags go back to what they were after
start-up. A job that failed, ran out of memory, or left the process larger than ``memory_limit`` allows ends the
process instead (the host forks a fresh one): a failed job's peers may be stuck in a collective, and memory may
not come back.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import importlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

#: The exit code of a worker that stopped before it said hello to the pool: it could not start (see
#: :mod:`optuna_saturn.pools.worker_starts`).
COULD_NOT_START = 3


def prepare_process(config: dict) -> dict[str, Any]:
    """What every worker needs, done once in the pool host before it forks them: imports (torch, optuna-saturn,
    the objective's module, what the objective imports lazily, what strategies import unless the warm-up found
    that it prepares nothing for one). Returns the objectives loaded, by recipe."""
    os.environ["OPTUNA_SATURN_WORKER"] = "1"
    import torch

    from optuna_saturn.engines import _clipping
    from optuna_saturn.integrations import _guard as accelerate_guard
    from optuna_saturn.process_state import reset_library_state
    from optuna_saturn.profiler._probe import warm_up
    from optuna_saturn.profiler._without_gpus import without_gpus

    torch.set_num_threads(1)  # no thread pool before the forks: each worker sizes its own
    _clipping.install()  # before any objective's module imports clip_grad_norm_
    accelerate_guard.install()  # (imports accelerate once, before the forks)
    objectives: dict[str, Any] = {}
    plain = False  # the objective prepares nothing: its trials run as they are, and no strategy is imported
    if config.get("preload") is not None:
        objective = _objective(objectives, config["preload"])
        with without_gpus():  # the workers are forked from this process: it must not touch a GPU
            plain = warm_up(objective)
    if not plain:
        _import_what_strategies_import(config.get("engines", ()), multi_device=bool(config.get("multi_device")))
    reset_library_state()  # what the executor's process (this is a fork of it) or the warm-up left set up
    _freeze_what_is_imported()
    return objectives


def _freeze_what_is_imported() -> None:
    """Move every object alive now (the modules imported: 350,000 objects with torch and transformers) out of
    the garbage collector's sight. A full collection over them costs 0.3 s here, 0.7 s under load: the worker
    collects after every job, and Python collects on its own during trials; now both see only what jobs
    create. The warm-up's garbage is collected first, so nothing collectable is frozen; the forks also keep
    sharing these pages, since collections no longer write to them."""

    gc.collect()
    gc.freeze()


def _objective(objectives: dict[str, Any], recipe: dict) -> Any:
    from optuna_saturn.worker.objective_recipe import load_objective

    key = json.dumps(recipe, sort_keys=True)
    if key not in objectives:
        objectives[key] = load_objective(recipe)
    return objectives[key]


def serve(config: dict, index: int, objectives: dict[str, Any] | None) -> NoReturn:
    """The worker of device ``index`` (a fork of the pool host, or, ``objectives`` None, a fresh interpreter it
    started, which prepares itself once bound to its GPU): runs the jobs the executor sends it. Whatever stops
    it (a failed start on its GPU, a broken channel) leaves its traceback in its log and a non-zero exit code,
    never a silent death."""
    from optuna_saturn.worker.tied_to_parent import WORKER_NAME, die_with_parent, name_process

    die_with_parent(config["host_pid"])
    name_process(f"{WORKER_NAME}{index}")
    faulthandler.enable(all_threads=True)  # a worker killed by a signal (a crash in CUDA, NCCL) leaves its stack
    up: list[bool] = []  # (it said hello to the pool: from then on it started)
    try:
        _serve(config, index, objectives, up)
    except BaseException as exc:
        import traceback

        traceback.print_exc()
        print(
            f"optuna-saturn: the worker of device {index} (pid {os.getpid()}) stopped on the error above "
            f"({type(exc).__name__}: {exc})"[:500],
            flush=True,
        )
        _exit(1 if up else COULD_NOT_START)
    _exit(0)


def _serve(config: dict, index: int, objectives: dict[str, Any] | None, up: list[bool]) -> None:
    from optuna_saturn.worker.launched import pin_to_device

    device = config["devices"][index]
    if device["kind"] == "cuda":
        _start_on_gpu(config, index)
    pin_to_device(device, pin_cores=config.get("pin_cores", True))
    if objectives is None:  # (the objective itself is imported by its first job)
        objectives = prepare_process({**config, "preload": None})

    from optuna_saturn.channel import ChannelClient
    from optuna_saturn.worker.memory import resident_memory

    size_threads(device, config.get("gpu_threads"))
    pool = ChannelClient(config["channel"], config["token"], hello={"worker": index})
    up.append(True)
    runner = JobRunner(
        device, objectives=objectives, memory_limit=config.get("memory_limit"), timeouts=config.get("timeouts")
    )
    while True:
        order = pool.call("next", worker=index)
        if order.get("exit"):
            break
        clean, recycle = runner.run(order["job"], worker=index)
        pool.call(
            "done", worker=index, job=order["job"]["name"], clean=clean, recycle=recycle, resident=resident_memory()
        )
        if recycle:
            return  # the host starts a fresh worker in this one's place
    pool.close()


def _start_on_gpu(config: dict, index: int) -> None:
    """Bind this worker to its GPU, wait for memory a killed predecessor held to come back, create its CUDA context
    now (not in its first job), and run it on the cores nearest its GPU."""
    from optuna_saturn.nvml import local_cores, used_memory
    from optuna_saturn.worker.gpu import create_context, own_gpu, wait_for_memory_back

    entry = config["gpus"][index]
    baseline = (config.get("memory_baseline") or {}).get(entry)
    if baseline is not None:
        back, waited = wait_for_memory_back(lambda: used_memory(entry), baseline)
        if waited > 0.5 or not back:
            print(
                f"optuna-saturn: waited {waited:.1f} s for GPU {entry}'s memory to come back "
                + ("" if back else "(it did not: starting anyway)"),
                flush=True,
            )
    own_gpu(entry)
    create_context()
    nearest = set(local_cores(entry)) & os.sched_getaffinity(0)
    if nearest:  # the CPU work of its trials (an offloaded optimizer step, data loading) on the GPU's NUMA node
        os.sched_setaffinity(0, nearest)


def _exit(code: int) -> NoReturn:
    from optuna_saturn.worker.rank import exit_now

    exit_now(code)


def size_threads(device: dict, gpu_threads: int | None = None) -> None:
    """A CPU device's worker runs as many torch threads as the device has cores; a GPU's, its share of the
    machine's cores (``gpu_threads``): the optimizer step of an offloading strategy, a collate function and saving
    a checkpoint run on the CPU."""
    import torch

    if device["kind"] == "cpu" and device["cores"]:
        torch.set_num_threads(len(device["cores"]))
    elif device["kind"] == "cuda" and gpu_threads:  # (no more than the cores it runs on, near its GPU)
        torch.set_num_threads(min(gpu_threads, len(os.sched_getaffinity(0))))


class JobRunner:
    """Runs one warm worker's jobs, one after another, each as one rank of its job's process group; shared by the
    pool host's workers and the Ray runner's actors. Every job starts from the process state the first one saw.

    Any error on the way (joining the process group, the job itself) ends the job unclean, with its traceback in
    the job's log and the rank's failure in its error file, and the process is replaced: a failed join or job may
    leave peers stuck and memory held."""

    def __init__(
        self,
        device: dict,
        *,
        objectives: dict[str, Any],
        memory_limit: float | None = None,
        timeouts: dict[str, float] | None = None,
    ) -> None:
        self._device = device
        self._objectives = objectives
        self._memory_limit = memory_limit
        self._timeouts = timeouts or {}
        self._baseline: Any = None

    def run(self, job: dict, *, worker: Any) -> tuple[bool, bool]:
        """Run ``job``; returns whether every step of it ended clean, and whether this process must be replaced
        (the job failed, so its peers may be stuck and memory may not come back, or the process grew too large)."""
        from optuna_saturn.worker.log_lines import say

        with _output_to(job["log"]):
            say(
                f"optuna-saturn: worker {worker} (pid {os.getpid()}) runs {job['name']} as rank {job['rank']} "
                f"of {job['world_size']}"
            )
            try:
                clean = self._run(job)
            except BaseException as exc:
                import traceback

                from optuna_saturn.worker.failures import error_kind, record_failure

                with contextlib.suppress(OSError):
                    traceback.print_exc()
                say(f"optuna-saturn: worker {worker} could not run {job['name']}: the error above.")
                record_failure(
                    job["errors"],
                    job["rank"],
                    f"{type(exc).__name__}: {exc}",
                    error_kind(exc, world_size=job["world_size"]),
                )
                return False, True
            why = self._why_replace()
            if why:
                say(f"optuna-saturn: worker {worker} is replaced after this job: {why}.")
        return clean, not clean or bool(why)

    def _run(self, job: dict) -> bool:
        from optuna_saturn.process_state import ProcessState
        from optuna_saturn.worker.memory import release_memory
        from optuna_saturn.worker.one_process import membership
        from optuna_saturn.worker.rank import join_process_group, leave_process_group, run_job

        fn = _objective(self._objectives, job["objective"])
        if self._baseline is None:  # the state every job starts from
            self._baseline = ProcessState.capture()
        with membership(job, self._device) as part:
            if not part.joins:  # it lent its cores to the job's first worker, which is done
                return True
            place = join_process_group(
                self._device,
                part.rank,
                part.world_size,
                init_method=part.rendezvous,
                rendezvous_timeout=job.get("timeout"),
                collective_timeout=self._timeouts.get("collective"),
            )
            clean = run_job(job, place, fn)
            if clean:
                leave_process_group(place)
                release_memory(place.device)
                self._baseline.restore()  # (and the libraries' process-wide state: see reset_library_state)
        return clean

    def _why_replace(self) -> str:
        """Why this process must not run another job, or ''."""
        from optuna_saturn.worker.gpu import LEFTOVER_BYTES, bound_elsewhere, leftover_memory
        from optuna_saturn.worker.memory import resident_memory

        kind = self._device["kind"]
        elsewhere = bound_elsewhere(kind)
        if elsewhere:
            return elsewhere
        leftover = leftover_memory(kind)
        if leftover > LEFTOVER_BYTES:
            return f"{leftover / 2**20:.0f} MiB stayed allocated on its GPU after the job released its memory"
        if self._memory_limit is not None and resident_memory() > self._memory_limit:
            return f"its resident memory exceeds worker_memory_limit ({self._memory_limit / 2**20:.0f} MiB)"
        return ""


def _import_what_strategies_import(engines: Sequence[str], *, multi_device: bool) -> None:
    """The sweep's engines (FSDP's alone takes 1.1 s here, DeepSpeed's library 1.2-1.7 s), and what the first
    DistributedDataParallel or fully_shard of a process imports (torch._dynamo and its dependencies, 0.9 s): paid
    once, before the workers fork, not during a trial; what the sweep's strategies do not use is not imported at
    all. DeepSpeed's accelerator is named in the environment (``DS_ACCELERATOR``), so importing it probes no GPU;
    if anything did, the host starts its workers fresh (see :mod:`optuna_saturn.pools.warm_host`)."""
    from optuna_saturn.engines import engine_class, traits_of

    for name in engines:
        engine_class(name)
        for library in traits_of(name).libraries:
            importlib.import_module(library)
    if multi_device:
        import torch._dynamo  # noqa: F401


@contextlib.contextmanager
def _output_to(path: str) -> Iterator[None]:
    """Send this process's stdout and stderr (Python's and the libraries' own) to the job's log."""
    from optuna_saturn.worker.log_lines import open_or_discard

    _flush()
    saved = os.dup(1), os.dup(2)
    fd = open_or_discard(path)  # (a full disk: the job runs without its log, and its result is kept)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        _flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def _flush() -> None:
    """Flush Python's streams, as far as the disk lets: what a full disk refused is not the job's failure."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):
            stream.flush()
