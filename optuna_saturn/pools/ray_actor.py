"""A warm worker of the Ray runner, as a Ray actor (made remote by :class:`~optuna_saturn.pools.ray.RayPool`), and
the per-sweep folder it keeps on its node."""

from __future__ import annotations

import glob
import os
import tempfile
from pathlib import Path

from optuna_saturn.pools.launch_commands import extensions_cache
from optuna_saturn.pools.logs import private_folder, tail
from optuna_saturn.worker.objective_recipe import localized


def sweep_folder(sweep: str) -> str:
    """The sweep's private folder on a node."""
    return os.path.join(tempfile.gettempdir(), f"optuna-saturn-ray-{sweep}")


def remove_sweep_folder(sweep: str) -> None:
    import shutil

    shutil.rmtree(sweep_folder(sweep), ignore_errors=True)


class DeviceActor:
    """A warm worker as a Ray actor (made remote by :class:`RayPool`): imports once, then runs job after job as
    one rank of each job's process group (:class:`~optuna_saturn.worker.warm.JobRunner`)."""

    def __init__(self, config: dict, device: dict) -> None:
        os.environ.update(
            {
                "PYTHONUNBUFFERED": "1",
                "GLOO_SOCKET_IFNAME": "lo",
                "NCCL_SOCKET_IFNAME": "lo",
                "TORCH_EXTENSIONS_DIR": config.get("extensions") or str(extensions_cache()),
            }
        )
        if device["kind"] == "cpu":
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        # one folder per sweep on this node: the objective's copy, jobs' logs and errors, and the rendezvous of
        # each job (its ranks are all on this node); the pool removes it at the end
        self._folder = self._rendezvous = sweep_folder(config["sweep"])
        private_folder(self._folder)
        from optuna_saturn.worker.warm import JobRunner, prepare_process, size_threads

        preload = None if config.get("preload") is None else localized(config["preload"], self._folder)
        objectives = prepare_process({**config, "preload": preload})
        size_threads(device)
        # Ray shows a GPU actor its own GPU only: it is device 0 here
        local = {**device, "index": 0} if device["kind"] == "cuda" else device
        self._runner = JobRunner(local, local_rank=0, objectives=objectives, memory_limit=config.get("memory_limit"))

    def ready(self) -> dict:
        return {"pid": os.getpid()}

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
