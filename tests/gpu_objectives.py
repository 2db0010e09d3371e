"""Objectives for the GPU contracts tested on CPU (tests/test_gpu_contracts.py): what each rank sees, an
out-of-memory on one rank only, an engine whose memory must be freed before the next run."""

from __future__ import annotations

import os
import sys
import weakref

import torch
import torch.distributed as dist
from objectives import Blocks, _endless, curve_of, regression_data

#: Weak references to the prepared models of the runs in this process (the test reads them).
PREPARED: list[weakref.ref] = []


def ranks_environment(trial) -> float:
    """Records what every rank of the job sees: the launcher's variables, its device, its CUDA mask."""
    trial.suggest_float("x", 0.0, 1.0)
    mine = {
        "rank": trial.rank,
        "trial_local_rank": trial.local_rank,
        "device": str(trial.device),
        "pid": os.getpid(),
        **{k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")},
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR"),
        "PYTORCH_NVML_BASED_CUDA_CHECK": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"),
        "deepspeed_imported": "deepspeed" in sys.modules,
    }
    every = [None] * trial.world_size
    if trial.world_size > 1:
        dist.all_gather_object(every, mine)
    else:
        every = [mine]
    trial.set_user_attr("ranks", every)
    with open("/proc/self/cmdline", "rb") as f:
        trial.set_user_attr("cmdline", [p.decode() for p in f.read().split(b"\0") if p])
    return 0.0


def out_of_memory_on_rank_1(trial) -> float:
    """Trains ``Blocks`` on a global batch of 32; on rank 1 only, a micro-batch of more than 8 rows runs out of
    memory, raised as a CUDA library would (a RuntimeError whose message says so), while rank 0 goes on into
    the step's collective and waits there."""
    lr = trial.suggest_float("lr", 0.01, 0.04, log=True)
    torch.manual_seed(0)
    model = Blocks()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = torch.utils.data.DataLoader(regression_data(512), batch_size=32, shuffle=True, drop_last=True)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    batches = _endless(loader)
    loss = torch.zeros(())
    for _step in trial.steps(12):
        x, y = next(batches)
        optimizer.zero_grad()
        for mx, my in trial.micro_batches((x, y)):
            if trial.rank == 1 and len(mx) > 8:
                raise RuntimeError("CUDA error: out of memory (simulated: cudaErrorMemoryAllocation)")
            loss = torch.nn.functional.mse_loss(model(mx), my)
            trial.backward(loss)
        optimizer.step()
    trial.set_user_attr("gradient_accumulation_seen", trial.gradient_accumulation)
    return trial.reduce_mean(loss)


def keeps_a_weak_reference(trial) -> float:
    """A short AdamW run whose prepared model (a DeepSpeed engine under ZeRO) the test watches through a weak
    reference: it must be gone before the worker empties its memory for the next run."""
    torch.manual_seed(0)
    model = Blocks()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(regression_data(64), batch_size=16)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    PREPARED.append(weakref.ref(model))
    loss = torch.zeros(())
    for _step, (x, y) in zip(trial.steps(3), loader):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        trial.backward(loss)
        optimizer.step()
    return float(loss)


class _Experts(torch.nn.Module):
    """A mixture of experts' ``experts``: a ModuleList inside a repeated block."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.experts = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(expert(x) for expert in self.experts) / len(self.experts)


class _T5LikeBlock(torch.nn.Module):
    """A block whose layers are a ModuleList, as T5's ``block[i].layer``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.layer = torch.nn.ModuleList(
            [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh()), _Experts(width)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = x + layer(x)
        return x


class NestedBlocks(torch.nn.Module):
    """Repeated blocks inside repeated blocks (T5's layers, MoE experts): three levels of ModuleList."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(8, width)
        self.block = torch.nn.ModuleList(_T5LikeBlock(width) for _ in range(2))
        self.out = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.block:
            x = block(x)
        return self.out(x)


def nested_curve(trial) -> float:
    """``same_curve`` on a model of nested ModuleLists."""
    return curve_of(trial, NestedBlocks)


#: The model of ``fits_only_sharded``: 6 layers of 4096 x 4096 (100.7 M parameters, 384 MiB in float32; with its
#: gradients and AdamW's two moments, 1.5 GiB of state to train on one device).
WIDE_MLP = {"width": 4096, "depth": 6}


def fits_only_sharded(trial) -> float:
    """A model that trains on one device only with all of its state there: too large for a small device, which
    half of it fits. Records each rank's peak memory over what it held when the run began. AdamW runs its
    ``foreach`` implementation, as it does on a GPU by default (on CPU torch defaults to a loop over the
    parameters): its temporaries then count as they do on a GPU."""
    from optuna_saturn.worker.memory import RunMemory

    lr = trial.suggest_float("lr", 1e-4, 1e-3, log=True)
    memory = RunMemory(trial.device)
    torch.manual_seed(0)
    width, depth = WIDE_MLP["width"], WIDE_MLP["depth"]
    model = WideMLP(width, depth)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)
    loader = torch.utils.data.DataLoader(regression_data(256), batch_size=16, shuffle=True)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    batches = _endless(loader)
    losses = []
    for _step in trial.steps(4):
        x, y = next(batches)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x.to(trial.device)), y.to(trial.device))
        trial.backward(loss)
        optimizer.step()
        losses.append(trial.reduce_mean(loss))
    peaks = [None] * trial.world_size
    if trial.world_size > 1:
        dist.all_gather_object(peaks, memory.peak())
    else:
        peaks = [memory.peak()]
    trial.set_user_attr("rank_peaks", peaks)
    trial.set_user_attr("losses", losses)
    return losses[-1]


class WideMLP(torch.nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(8, width)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))
        self.out = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.out(x)


def autocast_loop(trial) -> float:
    """A plain training loop under ``torch.autocast``, as users write it for one process: GPT-2, AdamW with an LR
    schedule, clipping; the autocast dtype from the test (bfloat16, or float16 with a GradScaler)."""
    from hf_objectives import Tokens, compute_dtypes, precision, tiny_gpt2

    learning_rate = trial.suggest_float("learning_rate", 1e-4, 1e-2, log=True)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision()]
    model = tiny_gpt2()
    dtypes = compute_dtypes(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1.0 + step))
    loader = torch.utils.data.DataLoader(
        Tokens(48, seed=1), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(3)
    )
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    scaler = torch.amp.GradScaler(trial.device.type) if dtype == torch.float16 else None
    curve = []
    batches = _endless(loader)
    for _step in trial.steps(12):
        batch = next(batches)
        optimizer.zero_grad()
        with torch.autocast(trial.device.type, dtype=dtype):
            loss = model(**batch).loss
        trial.backward(scaler.scale(loss) if scaler else loss)
        if scaler:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        scheduler.step()
        curve.append(trial.reduce_mean(loss.detach().float()))
    trial.set_user_attr("curve", curve)
    trial.set_user_attr("compute_dtypes", sorted(dtypes))
    return curve[-1]


def steady(trial) -> float:
    """Ten steps of 0.15 s: a runtime the sweep predicts well after one trial."""
    import time

    x = trial.suggest_float("x", 0.0, 1.0)
    for _ in trial.steps(10):
        time.sleep(0.15)
    return x


def slow_first_steps(trial) -> float:
    """Its first 4 steps take 0.06 s, the rest 0.01 s: a profile's first timed steps are not settled."""
    import time

    from objectives import Blocks

    trial.suggest_float("x", 0.0, 1.0)
    model = Blocks()
    loader = torch.utils.data.DataLoader(regression_data(64), batch_size=8)
    model, loader = trial.prepare(model, loader)
    for step in trial.steps(40):
        time.sleep(0.06 if step < 4 else 0.01)
    return 0.0


def slow_first_steps_on_rank_1(trial) -> float:
    """Trains for real, and only rank 1's last timed step (of the default 2 warm-up and 5 timed) is slow, after
    its all-reduce, so rank 0 waits for it in the next step, untimed: rank 1's timings say "time again", rank
    0's do not. Whether to time the steps again is one decision for every rank, or rank 0 leaves the loop while
    rank 1's next step waits in DDP's all-reduce."""
    import time

    from objectives import Blocks

    trial.suggest_float("x", 0.0, 1.0)
    model = Blocks()
    loader = torch.utils.data.DataLoader(regression_data(64), batch_size=8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    x, y = next(iter(loader))
    for step in trial.steps(40):
        loss = torch.nn.functional.mse_loss(model(x), y)
        trial.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(0.5 if step == 6 and trial.rank == 1 else 0.05)
    return trial.reduce_mean(loss.item())
