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
import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn


def prepare_process(config: dict) -> dict[str, Any]:
    """What every worker needs, done once in the pool host before it forks them: imports (torch, optuna-saturn,
    what strategies import, the objective's module, what the objective imports lazily). Returns the objectives
    loaded, by recipe."""
    os.environ["OPTUNA_SATURN_WORKER"] = "1"
    import torch

    from optuna_saturn.engines import _clipping
    from optuna_saturn.integrations import _guard as accelerate_guard
    from optuna_saturn.profiler._probe import warm_up
    from optuna_saturn.worker.process_state import reset_library_state

    torch.set_num_threads(1)  # no thread pool before the forks: each worker sizes its own
    _clipping.install()  # before any objective's module imports clip_grad_norm_
    accelerate_guard.install()  # (imports accelerate once, before the forks)
    _import_what_strategies_import(config.get("engines", ()), multi_device=bool(config.get("multi_device")))
    objectives: dict[str, Any] = {}
    if config.get("preload") is not None:
        warm_up(_objective(objectives, config["preload"]))
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


def serve(config: dict, index: int, objectives: dict[str, Any]) -> NoReturn:
    """The worker of device ``index`` (a fork of the pool host): runs the jobs the executor sends it."""
    from optuna_saturn.worker.launched import pin_to_device
    from optuna_saturn.worker.tied_to_parent import WORKER_NAME, die_with_parent, name_process

    die_with_parent(config["host_pid"])
    name_process(f"{WORKER_NAME}{index}")
    faulthandler.enable(all_threads=True)  # a worker killed by a signal (a crash in CUDA, NCCL) leaves its stack
    device = config["devices"][index]
    pin_to_device(device, pin_cores=config.get("pin_cores", True))

    from optuna_saturn.channel import ChannelClient
    from optuna_saturn.worker.rank import exit_now, resident_memory

    size_threads(device)
    pool = ChannelClient(config["channel"], config["token"], hello={"worker": index})
    runner = JobRunner(device, local_rank=index, objectives=objectives, memory_limit=config.get("memory_limit"))
    while True:
        order = pool.call("next", worker=index)
        if order.get("exit"):
            break
        clean, recycle = runner.run(order["job"], worker=index)
        pool.call(
            "done", worker=index, job=order["job"]["name"], clean=clean, recycle=recycle, resident=resident_memory()
        )
        if recycle:
            exit_now(0)  # the host starts a fresh worker in this one's place
    pool.close()
    exit_now(0)


def size_threads(device: dict) -> None:
    """A CPU device's worker runs as many torch threads as the device has cores."""
    import torch

    if device["kind"] == "cpu" and device["cores"]:
        torch.set_num_threads(len(device["cores"]))


class JobRunner:
    """Runs one warm worker's jobs, one after another, each as one rank of its job's process group; shared by the
    pool host's workers and the Ray runner's actors. Every job starts from the process state the first one saw."""

    def __init__(
        self, device: dict, *, local_rank: int, objectives: dict[str, Any], memory_limit: float | None = None
    ) -> None:
        self._device = device
        self._local_rank = local_rank  # a GPU worker sees the pool's GPUs and uses this one
        self._objectives = objectives
        self._memory_limit = memory_limit
        self._baseline: Any = None

    def run(self, job: dict, *, worker: Any) -> tuple[bool, bool]:
        """Run ``job``; returns whether every step of it ended clean, and whether this process must be replaced
        (the job failed, so its peers may be stuck and memory may not come back, or the process grew too large)."""
        from optuna_saturn.worker.one_process import membership
        from optuna_saturn.worker.process_state import ProcessState
        from optuna_saturn.worker.rank import (
            join_process_group,
            leave_process_group,
            release_memory,
            resident_memory,
            run_job,
        )

        fn = _objective(self._objectives, job["objective"])
        if self._baseline is None:  # the state every job starts from
            self._baseline = ProcessState.capture()
        with _output_to(job["log"]):
            print(
                f"optuna-saturn: worker {worker} (pid {os.getpid()}) runs {job['name']} as rank {job['rank']} "
                f"of {job['world_size']}",
                flush=True,
            )
            with membership(job, self._device) as part:
                if not part.joins:  # it lent its cores to the job's first worker, which is done
                    return True, False
                place = join_process_group(
                    self._device,
                    part.rank,
                    part.world_size,
                    local_rank=self._local_rank,
                    init_method=part.rendezvous,
                    timeout=job.get("timeout"),
                )
                clean = run_job(job, place, fn)
                if clean:
                    leave_process_group(place)
                    release_memory(place.device)
                    self._baseline.restore()  # (and the libraries' process-wide state: see reset_library_state)
        grown = self._memory_limit is not None and resident_memory() > self._memory_limit
        return clean, not clean or grown


def _import_what_strategies_import(engines: Sequence[str], *, multi_device: bool) -> None:
    """The sweep's engines (FSDP's alone takes 1.1 s here), and what the first DistributedDataParallel or
    fully_shard of a process imports (torch._dynamo and its dependencies, 0.9 s): paid once, before the workers
    fork, not during a trial; what the sweep's strategies do not use is not imported at all."""
    from optuna_saturn.engines import engine_class

    for name in engines:
        engine_class(name)
    if multi_device:
        import torch._dynamo  # noqa: F401


@contextlib.contextmanager
def _output_to(path: str) -> Iterator[None]:
    """Send this process's stdout and stderr (Python's and the libraries' own) to the job's log."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)
