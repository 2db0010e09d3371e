"""Objectives of the GPU review's checks (``review_checks.py``), importable by the workers.

Each records, at its start and before it builds anything, what its process sees: the memory its GPU still holds
from earlier jobs, its current device, ``LOCAL_RANK``, its mask, its threads, its pid.

The memory held is read as PyTorch's own leak checker reads it (``torch.testing._internal.common_utils``'s
``CudaMemoryLeakCheck``): after ``torch._C._cuda_clearCublasWorkspaces()``. cuBLAS keeps a workspace per handle and
stream through the caching allocator (32 MiB on sm90 by default), from the worker's first matrix product
(``create_context``) on, and ``empty_cache`` does not free it: it is no job's leftover. What was held before the
workspaces were cleared is kept too (``alloc_raw``, ``reserved_raw``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch


def _entry_facts(trial) -> None:
    cuda = trial.device.type == "cuda"
    raw = (torch.cuda.memory_allocated(trial.device), torch.cuda.memory_reserved(trial.device)) if cuda else (0, 0)
    if cuda:
        torch._C._cuda_clearCublasWorkspaces()
    trial.set_user_attr(
        "entry",
        {
            "alloc_raw": raw[0],
            "reserved_raw": raw[1],
            "alloc0": torch.cuda.memory_allocated(trial.device) if cuda else 0,
            "reserved0": torch.cuda.memory_reserved(trial.device) if cuda else 0,
            "current_device": torch.cuda.current_device() if cuda else -1,
            "local_rank_env": os.environ.get("LOCAL_RANK"),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "threads": torch.get_num_threads(),
            "cores": len(os.sched_getaffinity(0)),
            "pid": os.getpid(),
            # the worker's own state as each trial starts (the executor may start the next trial before it calls
            # the last one's callbacks, so a callback would see a trial running)
            "os_threads": int(_status().get("Threads", "0").strip() or 0),
            "fds": len(os.listdir("/proc/self/fd")),
            "used_mib": (lambda free, total: (total - free) / 2**20)(*torch.cuda.mem_get_info(trial.device))
            if cuda
            else None,
        },
    )


def _status() -> dict[str, str]:
    text = Path("/proc/self/status").read_text()
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def _mlp(width: int, depth: int) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def warm_worker(trial) -> float:
    """C2: 8 x Linear(4096) (134 M parameters, about 2 GB with AdamW), a batch of 256 random rows, 30 steps (the
    size and steps from the environment, for the DeepSpeed repeat and the dry run)."""
    _entry_facts(trial)
    lr = trial.suggest_float("lr", 1e-4, 1e-3, log=True)
    width, depth = int(os.environ.get("REVIEW_WIDTH", "4096")), int(os.environ.get("REVIEW_DEPTH", "8"))
    steps = int(os.environ.get("REVIEW_STEPS", "30"))
    torch.manual_seed(0)
    model = _mlp(width, depth)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    data = torch.utils.data.TensorDataset(torch.randn(1024, width))
    loader = torch.utils.data.DataLoader(data, batch_size=256, shuffle=True)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    batches = _endless(loader)
    loss = torch.zeros(())
    for _ in trial.steps(steps):
        (x,) = next(batches)
        optimizer.zero_grad()
        loss = model(x.to(trial.device)).pow(2).mean()
        trial.backward(loss)
        optimizer.step()
    return trial.reduce_mean(loss.detach())


def _endless(loader):
    while True:
        yield from loader


class _Rows(torch.utils.data.Dataset):
    """Row indices only: each micro-batch's inputs are made on the device (a global batch of millions of rows)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: int) -> int:
        return index


def activations_of_160_gb(trial) -> float:
    """C5: 4 x Linear(1024) on a global batch of about 4.8 M rows made on the device per micro-batch: about 20 GB
    per activation tensor, about 160 GB at one micro-batch (out of memory on a 141 GB GPU), half at two."""
    _entry_facts(trial)
    torch.backends.cuda.matmul.allow_tf32 = True  # (steps under a second)
    lr = trial.suggest_float("lr", 1e-4, 1e-3, log=True)
    rows = int(os.environ.get("REVIEW_ROWS", str(4_800_000)))
    torch.manual_seed(0)
    model = _mlp(1024, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = torch.utils.data.DataLoader(_Rows(rows * 4), batch_size=rows, collate_fn=torch.tensor)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    batches = iter(loader)
    loss = torch.zeros(())
    for _ in trial.steps(int(os.environ.get("REVIEW_STEPS", "6"))):
        batch = next(batches)
        optimizer.zero_grad()
        for part in trial.micro_batches(batch):
            x = torch.randn(len(part), 1024, device=trial.device)
            loss = model(x).pow(2).mean()
            trial.backward(loss)
        optimizer.step()
    return trial.reduce_mean(loss.detach())


def hog_or_grab(trial) -> float:
    """C6: "hog" takes 70% of the GPU, one step, then sleeps in its loop (stall detection kills it); "grab" then
    takes 70% at its first step and finishes: it fits only if the killed hog's memory came back first."""
    _entry_facts(trial)
    mode = trial.suggest_categorical("mode", ["hog", "grab"])
    total = torch.cuda.get_device_properties(trial.device).total_memory if trial.device.type == "cuda" else 2**30
    model = torch.nn.Linear(8, 1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8)), batch_size=8)
    model, loader = trial.prepare(model, loader)
    held = None
    for step in trial.steps(20):
        if step == 0:
            held = torch.empty(int(0.7 * total), dtype=torch.uint8, device=trial.device)
        if mode == "hog" and step == 1:
            time.sleep(60)
    del held
    return 0.0


def cpu_threads(trial) -> float:
    """C7: 3 AdamW steps over 50 M float32 parameters held on the CPU (``REVIEW_PARAMS``), at the worker's thread
    count and at one."""
    _entry_facts(trial)
    trial.suggest_float("x", 0, 1)
    params = [
        torch.nn.Parameter(torch.randn(int(os.environ.get("REVIEW_PARAMS", "50000000")) // 10)) for _ in range(10)
    ]
    for p in params:
        p.grad = torch.randn_like(p)
    timings = {}
    for threads in (torch.get_num_threads(), 1):
        torch.set_num_threads(threads)
        optimizer = torch.optim.AdamW(params, lr=1e-3)
        optimizer.step()  # (state allocated)
        started = time.perf_counter()
        for _ in range(3):
            optimizer.step()
        timings[str(threads)] = round((time.perf_counter() - started) / 3, 4)
    trial.set_user_attr("adamw_step_seconds", timings)
    return 0.0


def ddp_checkpointed(trial) -> float:
    """C8: a DDP trial with AdamW that saves a checkpoint every 5 of its 60 steps (``REVIEW_STEPS``; 0.1 s each): a
    test kills one of its ranks' workers mid-run; the trial runs again from its checkpoint."""
    _entry_facts(trial)
    torch.manual_seed(0)
    model = _mlp(64, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(256, 64)), batch_size=32)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    start = trial.restore(model, optimizer)
    batches = _endless(loader)
    loss = torch.zeros(())
    for step in trial.steps(int(os.environ.get("REVIEW_STEPS", "60")), start=start):
        (x,) = next(batches)
        optimizer.zero_grad()
        loss = model(x.to(trial.device)).pow(2).mean()
        trial.backward(loss)
        optimizer.step()
        time.sleep(0.1)
        if (step + 1) % 5 == 0:
            trial.checkpoint(step + 1, model, optimizer)
    return float(loss)


def bf16_autocast(trial) -> float:
    """C9: an MLP trained under ``torch.autocast(bfloat16)`` on the trial's device (the way users write mixed
    precision for one process); records the dtype its first layer computes in and the loss curve."""
    _entry_facts(trial)
    lr = trial.suggest_float("lr", 1e-4, 1e-2, log=True)
    width = int(os.environ.get("REVIEW_WIDTH", "1024"))
    torch.manual_seed(0)
    model = _mlp(width, 4)
    computed: set[str] = set()
    model[0].register_forward_hook(lambda module, args, output: computed.add(str(output.dtype)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    data = torch.utils.data.TensorDataset(torch.randn(256, width), torch.randn(256, width))
    loader = torch.utils.data.DataLoader(data, batch_size=64)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    batches = _endless(loader)
    curve = []
    for _ in trial.steps(int(os.environ.get("REVIEW_STEPS", "12"))):
        x, y = next(batches)
        optimizer.zero_grad()
        with torch.autocast(device_type=trial.device.type, dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(model(x.to(trial.device)).float(), y.to(trial.device))
        trial.backward(loss)
        optimizer.step()
        curve.append(trial.reduce_mean(loss.detach()))
    trial.set_user_attr("compute_dtypes", sorted(computed))
    trial.set_user_attr("curve", curve)
    return curve[-1]


class WideMLP(torch.nn.Module):
    """The model of ``fits_only_sharded`` (tests/gpu_objectives.py): blocks of width x width between a narrow
    input and output, so that its blocks hold nearly all of its parameters."""

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


def wide_mlp_size() -> tuple[int, int]:
    """C10's model, (width, depth): 12 blocks of 4096 (201 M parameters, 805 MB in float32, 3.2 GB to train
    whole with AdamW) on a GPU; from the environment in the dry run."""
    return int(os.environ.get("REVIEW_WIDTH", "4096")), int(os.environ.get("REVIEW_DEPTH", "12"))


def fits_only_sharded(trial) -> float:
    """C10: ``WideMLP`` with AdamW under the executor's ``device_memory`` cap, which the whole model's state does
    not fit: records the most the run held on its GPU at once (``torch.cuda.max_memory_allocated`` from the run's
    start, the model's construction included) and the model's own size in float32."""
    _entry_facts(trial)
    cuda = trial.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(trial.device)
    lr = trial.suggest_float("lr", 1e-4, 1e-3, log=True)
    width, depth = wide_mlp_size()
    torch.manual_seed(0)
    model = WideMLP(width, depth)
    whole = sum(p.numel() * 4 for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    data = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    batches = _endless(loader)
    losses = []
    for _ in trial.steps(int(os.environ.get("REVIEW_STEPS", "4"))):
        x, y = next(batches)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x.to(trial.device)), y.to(trial.device))
        trial.backward(loss)
        optimizer.step()
        losses.append(trial.reduce_mean(loss.detach()))
    trial.set_user_attr("gpu_peak_bytes", torch.cuda.max_memory_allocated(trial.device) if cuda else None)
    trial.set_user_attr("model_bytes", whole)
    return losses[-1]


class _TokenRows(torch.utils.data.Dataset):
    """Rows of random token ids, as Trainer's language models take them (the labels are the inputs)."""

    def __init__(self, rows: int, length: int = 32, vocab: int = 256) -> None:
        self.ids = torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def trainer_gpt2(trial) -> float:
    """C1: a ``transformers.Trainer`` objective as users write it (``TrainingArguments`` picks the device), on a
    GPT-2 of one layer: ``REVIEW_STEPS`` steps (20 by default) and an evaluation."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    _entry_facts(trial)
    lr = trial.suggest_float("lr", 1e-4, 1e-2, log=True)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=1, n_head=2))
    args = TrainingArguments(
        output_dir=str(Path(os.environ.get("GPU_CHECK_WORK", "/tmp")) / "trainer"),
        max_steps=int(os.environ.get("REVIEW_STEPS", "20")),
        per_device_train_batch_size=8,
        learning_rate=lr,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=trial.device.type == "cpu",
    )
    trainer = trial.prepare_trainer(
        Trainer(model=model, args=args, train_dataset=_TokenRows(64), eval_dataset=_TokenRows(16))
    )
    trainer.train()
    return trainer.evaluate()["eval_loss"]
