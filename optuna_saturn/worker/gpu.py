"""A worker and its one GPU: which GPU it sees, the environment its ranks show libraries, and its memory.

**One visible GPU per worker.** Every worker process is given its own ``CUDA_VISIBLE_DEVICES`` (one entry of the
pool's: an index, a UUID or a MIG instance) before anything in it touches CUDA, so its GPU is ``cuda:0`` whatever
asks: DeepSpeed and Accelerate (``set_device(LOCAL_RANK)``), ``TrainingArguments``, Lightning, and user code that
says ``"cuda:0"`` or ``torch.cuda.current_device()``. ``LOCAL_RANK`` is therefore 0 on every rank (the ordinal of
the one GPU it sees) and ``LOCAL_WORLD_SIZE`` 1; ``RANK`` and ``WORLD_SIZE`` are the job's. NCCL still uses
NVLink and PCIe peer-to-peer between workers: since CUDA 10.1 it connects peers it cannot see
(``p2pCanConnect``). The other choice, every worker seeing every GPU with ``LOCAL_RANK`` set to its ordinal, would
leave code that names ``cuda:0`` on another trial's GPU, and fails on Ray, where an actor sees one GPU.

A rank's ``is_local_main_process`` (Accelerate) is then true on every rank: node-local work guarded by it runs in
every rank. Guard such work with ``trial.is_main_process`` (the job's rank 0).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

#: Memory still allocated on a worker's GPU after a job's release, past which the worker is replaced: what a job's
#: code still references (a cache in a module, a leaked engine) would otherwise be held through the next job.
LEFTOVER_BYTES = 256 * 2**20
#: A replacement worker waits at most this long for a killed one's GPU memory to come back before it says hello.
MEMORY_BACK_SECONDS = 60.0
#: Memory used on the GPU within this much of what it was when the pool started counts as back.
MEMORY_BACK_MARGIN = 512 * 2**20


def own_gpu(entry: str) -> None:
    """Make ``entry`` (an entry of ``CUDA_VISIBLE_DEVICES``: an index, a ``GPU-`` UUID or a ``MIG-`` instance)
    the one GPU this process sees. Must come before this process touches CUDA: the driver reads the mask once."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError(
            f"CUDA was initialised in this worker before it was bound to its GPU ({entry}): it would run on "
            "another GPU than the one the sweep gave it."
        )
    os.environ["CUDA_VISIBLE_DEVICES"] = entry


def rank_environment(rank: int, world_size: int) -> dict[str, str]:
    """The variables a launcher would set for this rank, as libraries read them (DeepSpeed asserts
    ``LOCAL_RANK``; Accelerate and ``TrainingArguments`` pick their GPU by it): ``LOCAL_RANK`` is the ordinal of the
    one GPU this process sees (see the module's docstring)."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": str(rank),
        "MASTER_ADDR": "127.0.0.1",
    }


def create_context() -> None:
    """Create this worker's CUDA context and cuBLAS handle now, at its start, not inside its first job's timed or
    watched run (1-3 s on a large GPU)."""
    import torch

    torch.cuda.set_device(0)
    torch.cuda.init()
    (torch.ones(8, 8, device="cuda") @ torch.ones(8, 8, device="cuda")).sum().item()
    torch.cuda.empty_cache()


def bound_elsewhere(device_type: str) -> str | None:
    """After a run: why this process no longer drives its own GPU (something set another current device), or
    None. Such a process is replaced."""
    torch = sys.modules.get("torch")
    if device_type != "cuda" or torch is None or not torch.cuda.is_initialized():
        return None
    current = torch.cuda.current_device()
    return None if current == 0 else f"the current CUDA device is {current}, not the worker's own (0)"


def leftover_memory(device_type: str) -> float:
    """Bytes still allocated on this worker's GPU (0 on a CPU device)."""
    torch = sys.modules.get("torch")
    if device_type != "cuda" or torch is None or not torch.cuda.is_initialized():
        return 0.0
    return float(torch.cuda.memory_allocated(0))


def wait_for_memory_back(
    used: Callable[[], float | None],
    baseline: float,
    *,
    margin: float = MEMORY_BACK_MARGIN,
    timeout: float = MEMORY_BACK_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[bool, float]:
    """Wait until the GPU's used memory is back within ``margin`` of ``baseline`` (what it was when the pool
    started): a killed worker's memory is freed by the driver some time after the process is gone, and a job
    started meanwhile would run out of memory and teach the planner a false limit. Returns whether it came back
    (False: timed out, or NVML cannot tell) and the seconds waited."""
    started = clock()
    while True:
        now_used = used()
        if now_used is None:
            return False, clock() - started
        if now_used <= baseline + margin:
            return True, clock() - started
        if clock() - started >= timeout:
            return False, clock() - started
        sleep(0.1)
