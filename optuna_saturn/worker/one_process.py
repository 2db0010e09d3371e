"""A job of a one-process strategy (``one_process = true``: the built-in ``threads``) on the workers of several
CPU devices.

On CPU devices one process using the cores of two devices often trains faster than DDP across them: no gradient
all-reduce, one copy of the model, and PyTorch's intra-op threads scale well enough on one model (a GPT-2 trial
on 2 cores: 1.4-1.7x faster on two threads than on one). So the job's first worker runs the objective alone, as
a process group of one, with as many torch threads as all the job's devices have cores (and, where workers are
pinned, those cores); the other workers lend their cores and wait, each keeping its device busy for the pool
until the first one is done, so that no other job is given it meanwhile.

The workers agree through a file store beside the job's rendezvous: each says its cores, and the first says when
it is done. A waiting worker has no deadline (a trial may run for hours): if the first one dies, the pool stops the
job's other ranks after its grace period, as for any job with a failed rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

#: How often a lending worker looks whether the job's first worker is done.
POLL_SECONDS = 0.2
_DONE = "done"


@dataclass(frozen=True)
class Membership:
    """How this worker takes part in its job: as a rank of the job's process group (``joins``), or lending its
    cores to the job's first worker."""

    joins: bool
    rank: int
    world_size: int
    rendezvous: str


def is_one_process(job: dict) -> bool:
    return bool((job.get("strategy") or {}).get("one_process"))


@contextlib.contextmanager
def membership(job: dict, device: dict) -> Iterator[Membership]:
    """This worker's part in ``job``. For a one-process job on several devices, the first worker runs with every
    device's cores while inside, and the others wait for it before they yield."""
    if not is_one_process(job) or job["world_size"] == 1:
        yield Membership(True, job["rank"], job["world_size"], job["rendezvous"])
        return
    import torch
    import torch.distributed as dist

    store = dist.FileStore(job["rendezvous"][len("file://") :] + ".cores", job["world_size"])
    store.set_timeout(timedelta(seconds=job.get("timeout") or 600))
    store.set(f"cores-{job['rank']}", json.dumps(device.get("cores") or []))
    if job["rank"] != 0:
        while not store.check([_DONE]):
            time.sleep(POLL_SECONDS)
        yield Membership(False, job["rank"], job["world_size"], job["rendezvous"])
        return
    store.wait([f"cores-{r}" for r in range(job["world_size"])])
    cores = sorted({c for r in range(job["world_size"]) for c in json.loads(store.get(f"cores-{r}"))})
    pinned = os.sched_getaffinity(0)
    try:
        if cores:
            if pinned < set(cores):  # the worker was pinned to its own device's cores: widen to the job's
                os.sched_setaffinity(0, cores)
            torch.set_num_threads(len(cores))  # (the worker's own count comes back with its process state)
        yield Membership(True, 0, 1, job["rendezvous"] + ".one")
    finally:
        if os.sched_getaffinity(0) != pinned:
            os.sched_setaffinity(0, pinned)
        store.set(_DONE, "1")
