"""Objectives of the two-GPU parts M1-M4 (``checks_two_gpus.py``), importable by the workers. Each rank records
where it runs from inside the trial (review_objectives' ``entry``); the job's ranks' records are gathered on rank 0
into the ``ranks`` user attribute."""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist
from review_objectives import _entry_facts


def _gather_entries(trial) -> None:
    _entry_facts(trial)
    mine = dict(trial.user_attrs["entry"])
    mine["device"], mine["rank"] = str(trial.device), trial.rank
    props = torch.cuda.get_device_properties(0) if trial.device.type == "cuda" else None
    mine["uuid"] = str(getattr(props, "uuid", "")) if props is not None else None
    every: list = [None] * trial.world_size
    if trial.world_size > 1:
        dist.all_gather_object(every, mine)
    else:
        every = [mine]
    trial.set_user_attr("ranks", every)


def placement(trial) -> float:
    """M1: one step of a small model; records where it ran (its mask, its GPU's UUID as CUDA names it)."""
    trial.suggest_float("x", 0.0, 1.0)
    _gather_entries(trial)
    model = torch.nn.Linear(8, 1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 8)), batch_size=8)
    model, loader = trial.prepare(model, loader)
    for _ in trial.steps(1):
        pass
    return 0.0


def out_of_memory_on_rank_1(trial) -> float:
    """M2: a DDP step in which rank 1 alone asks for twice its GPU's memory (a real CUDA out of memory; raised as
    torch raises it on a CPU device), while rank 0 goes on into the step's gradient all-reduce and waits there."""
    trial.suggest_float("x", 0.0, 1.0)
    _gather_entries(trial)
    model = torch.nn.Linear(64, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 64)), batch_size=16)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    for step, (x,) in zip(trial.steps(4), loader):
        optimizer.zero_grad()
        if step == 1 and trial.rank == 1:
            if trial.device.type != "cuda":
                raise torch.OutOfMemoryError("out of memory (the dry run's stand-in for CUDA's)")
            total = torch.cuda.get_device_properties(trial.device).total_memory
            torch.empty(2 * total, dtype=torch.uint8, device=trial.device)
        trial.backward(model(x.to(trial.device)).pow(2).mean())
        optimizer.step()
    return 0.0


def all_reduce_bandwidth(trial) -> float:
    """M3: the bus bandwidth of an all-reduce between the job's two workers, each of which sees one GPU
    (``REVIEW_ALL_REDUCE_MIB`` per rank, 256 MiB by default; 5 timed after 2 warm-ups), in GB/s as NCCL's tests
    count it: bytes x 2 (n - 1) / n / seconds."""
    trial.suggest_float("x", 0.0, 1.0)
    _gather_entries(trial)
    model = torch.nn.Linear(8, 1)
    model = trial.prepare(model)
    size = int(os.environ.get("REVIEW_ALL_REDUCE_MIB", "256")) * 2**20
    tensor = torch.ones(size // 4, dtype=torch.float32, device=trial.device)
    for _ in range(2):
        dist.all_reduce(tensor)
    sync = torch.cuda.synchronize if trial.device.type == "cuda" else (lambda: None)
    sync()
    started = time.perf_counter()
    for _ in range(5):
        dist.all_reduce(tensor)
    sync()
    seconds = (time.perf_counter() - started) / 5
    n = trial.world_size
    trial.set_user_attr("bus_gb_per_s", round(size * 2 * (n - 1) / n / seconds / 1e9, 2))
    trial.set_user_attr("backend", dist.get_backend())
    return 0.0


def killed_mid_collective(trial) -> float:
    """M4: all-reduces, step after step; with ``kill`` set, rank 1 kills its own worker (SIGKILL) at step 5 once
    rank 0 has gone into that step's all-reduce, after writing the time to ``REVIEW_KILL_MARK``."""
    kill = trial.suggest_int("kill", 0, 1)
    _gather_entries(trial)
    model = torch.nn.Linear(8, 1)
    model = trial.prepare(model)
    tensor = torch.ones(1 << 20, device=trial.device)
    for step in trial.steps(10):
        if kill and step == 5 and trial.rank == 1:
            time.sleep(1.0)  # (rank 0 is in the all-reduce by now)
            with open(os.environ["REVIEW_KILL_MARK"], "w") as mark:
                mark.write(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(tensor)
    return float(tensor[0])
