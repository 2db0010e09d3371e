"""Entry point of a worker process that a launcher started for one job:
``python -m optuna_saturn.worker.launched SPEC``.

Strategies whose launcher must own the processes (a user's template with ``launcher = "deepspeed"`` or
``"accelerate"``) run this way; every other job runs in a warm worker (``optuna_saturn.worker.warm``). It pins the
process to its device, joins the job's process group from the launcher's environment, runs the job
(:func:`optuna_saturn.worker.rank.run_job`) and exits.
"""

from __future__ import annotations

import json
import os
import sys
from typing import NoReturn


def pin_to_device(device: dict, *, pin_cores: bool = True) -> None:
    """Size the thread pools to the device's cores before torch starts them, and pin the process to those cores
    if ``pin_cores`` (see :func:`optuna_saturn.devices.pin_cores`)."""
    if device["kind"] == "cpu" and device["cores"]:
        if pin_cores:
            os.sched_setaffinity(0, device["cores"])
        os.environ["OMP_NUM_THREADS"] = str(len(device["cores"]))


def main(spec_path: str) -> NoReturn:
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    device = spec["devices"][local_rank]
    if device["kind"] == "cuda":  # the launcher showed every rank the job's GPUs: this one keeps its own
        from optuna_saturn.worker.gpu import own_gpu

        own_gpu(os.environ["CUDA_VISIBLE_DEVICES"].split(",")[local_rank])
    os.environ.update({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank)})
    pin_to_device(device, pin_cores=spec.get("pin_cores", True))
    os.environ["OPTUNA_SATURN_WORKER"] = "1"

    import torch

    from optuna_saturn.engines import _clipping
    from optuna_saturn.worker.failures import error_kind, record_failure
    from optuna_saturn.worker.objective_recipe import load_objective
    from optuna_saturn.worker.rank import exit_now, join_process_group, leave_process_group, run_job

    if device["kind"] == "cpu" and device["cores"]:
        torch.set_num_threads(len(device["cores"]))
    try:
        place = join_process_group(device, rank, world_size)
        _clipping.install()  # before the objective's module imports clip_grad_norm_
        clean = run_job({**spec, "errors": spec_path}, place, load_objective(spec["objective"]))
    except BaseException as exc:  # a failed join or start: its traceback in the log, its failure for the sweep
        import traceback

        traceback.print_exc()
        record_failure(spec_path, rank, f"{type(exc).__name__}: {exc}", error_kind(exc, world_size=world_size))
        exit_now(1)
    if not clean:
        exit_now(1)  # peers may be stuck in a collective; the launcher stops them
    leave_process_group(place)
    exit_now(0)


if __name__ == "__main__":
    main(sys.argv[1])
