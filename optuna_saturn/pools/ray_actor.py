"""A warm worker of the Ray runner, as a Ray actor (made remote by :class:`~optuna_saturn.pools.ray.RayWorkers`), and
the per-sweep folder it keeps on its node."""

from __future__ import annotations

import glob
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from optuna_saturn.pools.launch_commands import worker_environment
from optuna_saturn.pools.logs import private_folder, tail
from optuna_saturn.pools.ray_lease import ActorLease, actor_lease_names
from optuna_saturn.worker.objective_recipe import localized

if TYPE_CHECKING:
    from optuna_saturn.worker.warm import JobRunner


def sweep_folder(sweep: str) -> str:
    """The sweep's private folder on a node."""
    return os.path.join(tempfile.gettempdir(), f"optuna-saturn-ray-{sweep}")


def remove_sweep_folder(sweep: str) -> None:
    import shutil

    shutil.rmtree(sweep_folder(sweep), ignore_errors=True)


def actor_gpu() -> str:
    """The GPU Ray gave this actor, as a ``CUDA_VISIBLE_DEVICES`` entry. Ray sets the actor's mask to it, except
    where ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` is set (some stacks do), when the actor would see every
    GPU of its node and run on the first: its accelerator ids say which is its own."""
    import ray

    ids = [str(i) for i in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]
    if len(ids) != 1:
        raise RuntimeError(f"A GPU worker's Ray actor must hold exactly one GPU; Ray gave it {ids or 'none'}.")
    return ids[0]


class DeviceActor:
    """A warm worker as a Ray actor (made remote by :class:`RayWorkers`): leases its device on its node
    (:mod:`~optuna_saturn.pools.ray_lease`), imports once, then runs job after job as one rank of each job's
    process group (:class:`~optuna_saturn.worker.warm.JobRunner`)."""

    def __init__(self, config: dict, device: dict) -> None:
        # one folder per sweep on this node: the objective's copy, jobs' logs and errors, and the rendezvous of
        # each job (its ranks are all on this node); the pool removes it at the end
        self._folder = self._rendezvous = sweep_folder(config["sweep"])
        private_folder(self._folder)
        os.environ.update(
            {
                "PYTHONUNBUFFERED": "1",
                "GLOO_SOCKET_IFNAME": "lo",
                **worker_environment(device["kind"], Path(self._folder)),
            }
        )
        if config.get("extensions"):  # (the driver's TORCH_EXTENSIONS_DIR wins, as on its own machine)
            os.environ["TORCH_EXTENSIONS_DIR"] = config["extensions"]
        self._config, self._device = config, device
        self._gpu = actor_gpu() if device["kind"] == "cuda" else None
        self._lease = ActorLease(config, device, actor_lease_names(device, self._gpu))
        self._runner: JobRunner | None = None

    def ready(self) -> dict:
        """The actor's pid once it is started; until its device's lease is free, who holds it
        (``{"waiting_for": ...}``, after a few seconds of trying)."""
        if self._runner is None:
            holder = self._lease.take()
            if holder is not None:
                return {"waiting_for": holder}
            self._runner = self._start()
        return {"pid": os.getpid()}

    def _start(self) -> JobRunner:
        """What makes the worker warm, once its device is leased: its GPU's context, the imports, the runner."""
        config, device = self._config, self._device
        if self._gpu is not None:
            from optuna_saturn.worker.gpu import create_context, own_gpu

            own_gpu(self._gpu)
            create_context()
        from optuna_saturn.worker.warm import JobRunner, prepare_process, size_threads

        preload = None if config.get("preload") is None else localized(config["preload"], self._folder)
        objectives = prepare_process({**config, "preload": preload})
        size_threads(device, config.get("gpu_threads"))
        return JobRunner(
            device, objectives=objectives, memory_limit=config.get("memory_limit"), timeouts=config.get("timeouts")
        )

    def run(self, job: dict) -> dict:
        here = os.path.join
        job = {
            **job,
            "objective": localized(job["objective"], self._folder),
            "errors": here(self._folder, os.path.basename(job["errors"])),
            "log": here(self._folder, f"{job['name']}.rank{job['rank']}.log"),
            "rendezvous": "file://" + here(self._rendezvous, job["rendezvous"]),
        }
        if "entries" in job:
            job["entries"] = [{**e, "objective": job["objective"], "errors": job["errors"]} for e in job["entries"]]
        if self._runner is None:
            raise RuntimeError("a job was sent to a worker before it was ready (it waits for its device's lease)")
        try:
            clean, recycle = self._runner.run(job, worker=job["worker"])
        finally:
            if job["rank"] == 0:
                Path(job["rendezvous"][len("file://") :]).unlink(missing_ok=True)
        errors = {}
        for path in glob.glob(glob.escape(job["errors"]) + ".rank*.error.json"):
            errors[os.path.basename(path)] = Path(path).read_text(encoding="utf-8")
            os.unlink(path)
        log = Path(job["log"])
        text = tail(log)  # (a rank that printed gigabytes sends back its end, where its error is)
        log.unlink(missing_ok=True)
        return {"clean": clean, "recycle": recycle, "log": text, "errors": errors}
