"""Workloads for the planner benchmarks: an analytic cost model for a paper-like sweep, and random instances.

Cost model (documented so that the numbers can be checked by hand; constants are module-level).

Hardware: one node of 8 A100/H100-class GPUs with 80 GB each, bf16 peak 312 TFLOP/s, NVLink/NVSwitch with an
effective collective bus bandwidth of 150 GB/s, PCIe at 16 GB/s per GPU to the host, and a host-side CPU Adam
that updates 2e9 parameters per second (shared by the node).

Per trial: a model with ``P`` parameters, ``L`` layers, hidden size ``h``, sequence length ``s``, trained on a
fixed number of tokens with a global batch of ``B`` sequences, so ``steps = tokens / (B * s)``. On ``N`` devices
each device processes ``B / N`` sequences per step, in micro-batches of ``mb`` (the largest power of two
``<= B / N`` whose activations fit; gradient accumulation does the rest).

- Compute: ``6 * P * tokens`` FLOPs (forward + backward), split over ``N`` devices, at an MFU that grows with
  the micro-batch: ``MFU = 0.45 * t / (t + 1024)`` with ``t = mb * s`` tokens per micro-batch. Activation
  checkpointing recomputes the forward pass: +33% compute.
- Communication per step (ring collectives, bytes per device ``~ 2 (N-1)/N * bytes``):
  DDP all-reduces bf16 gradients, ``2P`` bytes; ZeRO-2 reduce-scatters gradients and all-gathers parameters,
  the same volume; FSDP / ZeRO-3 all-gather parameters twice (forward, backward) and reduce-scatter gradients,
  ``3 x 2P`` bytes (ZeRO-3 at 90% of FSDP's bandwidth: smaller default buckets). Half the compute time can hide
  communication (bucketed overlap): exposed = max(0, comm - 0.5 * compute).
- Offload (ZeRO-3-offload): bf16 gradients down and parameters up over PCIe, ``4P / N`` bytes per device per
  step, plus CPU Adam over all ``P`` parameters; neither overlaps compute.
- Startup: 60 s plus loading ``2P`` bytes at 2 GB/s.

Memory per device (must be <= 80 GB minus 4 GB of framework overhead): model states are 16 bytes/param in
mixed precision (bf16 params 2 + grads 2 + fp32 master 4 + Adam 8). single/DDP keep all ``16P``; ZeRO-2 keeps
``2P + 14P / N``; FSDP/ZeRO-3 keep ``16P / N`` plus two gathered layers; ZeRO-3-offload keeps ``2P / N`` plus two
gathered layers. Activations per sequence ``34 * s * h * L`` bytes (Korthikanti et al. 2022, flash attention),
``2 * s * h * L + 34 * s * h`` with checkpointing. A strategy with checkpointing ("-ckpt") is offered only when
the plain one does not fit. Options that do not fit even with micro-batch 1 are dropped.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from optuna_saturn.planner import Job, Option

GPU_MEMORY = 80e9
RESERVED = 4e9
PEAK_FLOPS = 312e12
MFU_MAX = 0.45
MFU_HALF_TOKENS = 1024
BUS_BANDWIDTH = 150e9
PCIE_BANDWIDTH = 16e9
CPU_ADAM_PARAMS_PER_S = 2e9
OVERLAP = 0.5
DEVICE_COUNTS = (1, 2, 4, 8)


@dataclass(frozen=True)
class Model:
    name: str
    params: float
    layers: int
    hidden: int
    seq: int
    tokens: float  # training tokens per trial


GPT2_XL = Model("gpt2-xl-1.5b", 1.5e9, 48, 1600, 1024, 60e6)
GPT_J = Model("gpt-j-6b", 6.0e9, 28, 4096, 2048, 25e6)
VIT_H = Model("vit-h-632m", 0.632e9, 32, 1280, 257, 120e6)  # 257 tokens per 224px image, ~470k images

PAPER_LIKE = ((GPT2_XL, (16, 32)), (GPT_J, (8, 16)), (VIT_H, (256, 512)))
LEARNING_RATES = (1e-5, 1e-4, 1e-3)

# strategy -> (devices allowed, per-device model-state bytes per param as f(N), comm factor, offload)
STRATEGIES = {
    "single": ((1,), lambda n: 16.0, 0.0, False),
    "ddp": ((2, 4, 8), lambda n: 16.0, 1.0, False),
    "zero2": ((2, 4, 8), lambda n: 2.0 + 14.0 / n, 1.0, False),
    "fsdp": ((2, 4, 8), lambda n: 16.0 / n, 3.0, False),
    "zero3": ((2, 4, 8), lambda n: 16.0 / n, 3.0 / 0.9, False),
    "zero3-offload": ((1, 2, 4, 8), lambda n: 2.0 / n, 3.0 / 0.9, True),
}


def option_runtime(model: Model, batch: int, strategy: str, n: int, ckpt: bool) -> float | None:
    """Seconds for the whole trial, or None if it does not fit in memory even at micro-batch 1."""
    allowed, state_bytes, comm_factor, offload = STRATEGIES[strategy]
    if n not in allowed or batch % n:
        return None
    sharded = strategy in ("fsdp", "zero3", "zero3-offload")
    states = state_bytes(n) * model.params + (2 * 2 * model.params / model.layers if sharded else 0.0)
    per_seq = (2 * model.seq * model.hidden * model.layers + 34 * model.seq * model.hidden) if ckpt \
        else 34 * model.seq * model.hidden * model.layers
    budget = GPU_MEMORY - RESERVED - states
    mb = batch // n
    while mb >= 1 and mb * per_seq > budget:
        mb //= 2
    if mb < 1:
        return None
    steps = model.tokens / (batch * model.seq)
    tokens_mb = mb * model.seq
    mfu = MFU_MAX * tokens_mb / (tokens_mb + MFU_HALF_TOKENS)
    compute = 6 * model.params * batch * model.seq / n / (PEAK_FLOPS * mfu) * (4 / 3 if ckpt else 1.0)
    comm = comm_factor * 2 * (n - 1) / n * 2 * model.params / BUS_BANDWIDTH if n > 1 else 0.0
    step = compute + max(0.0, comm - OVERLAP * compute)
    if offload:
        step += 4 * model.params / n / PCIE_BANDWIDTH + model.params / CPU_ADAM_PARAMS_PER_S
    return 60.0 + 2 * model.params / 2e9 + steps * step


def model_options(model: Model, batch: int) -> list[Option]:
    """Every memory-feasible (strategy, device count) option; "-ckpt" only where the plain variant does not fit."""
    out = []
    for strategy in STRATEGIES:
        for n in DEVICE_COUNTS:
            plain = option_runtime(model, batch, strategy, n, ckpt=False)
            if plain is not None:
                out.append(Option(strategy, n, plain))
                continue
            ckpt = option_runtime(model, batch, strategy, n, ckpt=True)
            if ckpt is not None:
                out.append(Option(f"{'single' if strategy == 'single' else strategy}-ckpt", n, ckpt))
    return out


def paper_like() -> list[Job]:
    """3 model families x 2 batch sizes x 3 learning rates = 18 trials on one 8 x 80 GB node."""
    jobs = []
    for model, batches in PAPER_LIKE:
        for batch in batches:
            for lr in LEARNING_RATES:
                jobs.append(Job(f"{model.name}-b{batch}-lr{lr:g}", model_options(model, batch)))
    return jobs


def random_workload(n: int, seed: int, *, max_devices: int = 8) -> list[Job]:
    """Seeded synthetic trials: runtimes 10 min to 3 h on one device, sub-linear speed-up, some 1-device-infeasible."""
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        base = rng.uniform(600, 10_800)
        alpha = rng.uniform(0.5, 0.95)  # parallel efficiency per doubling
        options = []
        for d in DEVICE_COUNTS:
            if d > max_devices:
                continue
            for strategy, penalty in (("ddp" if d > 1 else "single", 1.0), ("fsdp", rng.uniform(1.0, 1.25))):
                if d == 1 and strategy == "fsdp":
                    continue
                options.append(Option(strategy, d, base / d / alpha ** (d.bit_length() - 1) * penalty))
        if rng.random() < 0.15:
            options = [o for o in options if o.devices >= 2]
        jobs.append(Job(f"r{seed}-{i}", options))
    return jobs


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    """Rows as a markdown table (floats with 3 significant decimals)."""
    def fmt(x: object) -> str:
        return f"{x:.3f}" if isinstance(x, float) else str(x)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    print("| trial | options (strategy x devices: runtime s) |")
    print("|---|---|")
    for job in paper_like()[::3]:
        opts = ", ".join(f"{o.strategy}x{o.devices}: {o.runtime:.0f}" for o in sorted(
            job.options, key=lambda o: (o.devices, o.runtime)))
        print(f"| {job.name.rsplit('-lr', 1)[0]} | {opts} |")
