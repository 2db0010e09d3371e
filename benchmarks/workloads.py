"""Workloads for the planner benchmarks: an analytic cost model for a paper-like sweep, and random instances.

Cost model (documented so that the numbers can be checked by hand; constants are module-level, each with its
source or marked as an assumption; benchmarks/README.md "Cost model review" lists the evidence).

Hardware: one node of 8 A100-80GB-class GPUs, bf16 peak 312 TFLOP/s and HBM 2.0 TB/s (NVIDIA A100 datasheet),
NVLink/NVSwitch with an effective collective bus bandwidth of 150 GB/s (assumption, conservative: nccl-tests
report ~208 GB/s all-reduce bus bandwidth between NVLink-connected A100s for large messages,
NVIDIA/nccl-tests#178, and one block's parameters are 40-430 MB here) and a per-collective latency of 20 us
(nccl-tests small-message time on A100 is ~10 us for 2 GPUs, NVIDIA/nccl#583; doubled for an 8-GPU ring,
assumption), PCIe at 16 GB/s per GPU to the host (assumption), and a host-side CPU Adam that updates 2e9
parameters per second (shared by the node; assumption).

Per trial: a model with ``P`` parameters, ``L`` layers, hidden size ``h``, sequence length ``s``, trained on a
fixed number of tokens with a global batch of ``B`` sequences, so ``steps = tokens / (B * s)``. On ``N`` devices
each device processes ``B / N`` sequences per step, in ``k`` micro-batches of ``mb`` (the largest power of two
``<= B / N`` whose activations fit; gradient accumulation does the rest).

- Compute: ``6 * P * tokens`` FLOPs (forward + backward), split over ``N`` devices, at an MFU that grows with
  the micro-batch: ``MFU = 0.45 * t / (t + 1024)`` with ``t = mb * s`` tokens per micro-batch (assumption: tuned
  FSDP stacks reach 52-64% MFU on 8 x A100 with >= 4k tokens per micro-batch, llm-foundry's benchmark tables;
  Hugging Face implementations are 3-5x slower than flash-attention's, its training README; no published MFU
  at 1-2k tokens per micro-batch was found). Activation checkpointing recomputes the forward pass: +33% compute.
- Communication (ring collectives; an all-reduce moves ``2 (N-1)/N * bytes`` per device, an all-gather or a
  reduce-scatter ``(N-1)/N * bytes``; bf16 so ``bytes = 2P``), each collective also paying the latency above:
  DDP all-reduces gradients once per step (``no_sync`` during accumulation), in 25 MB buckets (DDP's default
  ``bucket_cap_mb``); ZeRO-2 reduce-scatters gradients every micro-batch and all-gathers the updated parameters
  once per step, same buckets; FSDP / ZeRO-3 all-gather parameters twice (forward, backward) and reduce-scatter
  gradients every micro-batch, three collectives per layer, i.e. ``3 (N-1)/N * 2P`` bytes, 1.5x DDP's volume
  (ZeRO paper, Rajbhandari et al. 2020, sec. 7.2.2); ZeRO-3 at 90% of FSDP's bandwidth (assumption: smaller
  default buckets). Half a micro-batch's compute can hide that micro-batch's communication (bucketed overlap,
  assumption): exposed per micro-batch = max(0, comm - 0.5 * compute); the per-step collectives (DDP's
  all-reduce, ZeRO-2's all-gather) can hide only behind the last micro-batch.
- Optimizer step (not overlapped): mixed-precision Adam streams ~28 bytes per parameter it updates (fp32 master,
  m and v read and written, bf16 gradient read, bf16 parameter written) at HBM bandwidth; single and DDP update
  all ``P`` on every device (DDP replicates the step), ZeRO-2 / FSDP / ZeRO-3 only their ``P / N`` shard.
- Offload (ZeRO-3-offload): bf16 gradients down and parameters up over PCIe, ``4P / N`` bytes per device per
  step, plus CPU Adam over all ``P`` parameters; neither overlaps compute.
- Startup: 60 s plus loading ``2P`` bytes at 2 GB/s (assumption) when every trial is launched (the baselines:
  a fresh interpreter, its imports and NCCL's initialisation each time). optuna-saturn's warm workers start once
  per sweep (``POOL_START_SECONDS``, the same 60 s) and each trial then pays a new process group
  (``WARM_JOB_SECONDS``: an NCCL communicator for up to 8 GPUs, a few seconds; assumption 10 s) plus its model load.
- Elastic resize (a running trial checkpointed, stopped and restarted under another option): its checkpoint of
  ``16P`` bytes (the model states above) written and read back at ``CHECKPOINT_BANDWIDTH`` (a node-local NVMe
  at 2 GB/s, assumption), a new process group (``WARM_JOB_SECONDS``) and the model load; the steps since its
  last checkpoint are not lost (the executor stops a moved trial right after a checkpoint).
- Profiling: a measured option costs its set-up (``WARM_JOB_SECONDS`` plus the model load) and
  ``PROFILE_STEPS`` steps (2 warm-up and 5 timed, the executor's default), on all of its devices.

Memory per device (must be <= 80 GB minus 4 GB of framework overhead): model states are 16 bytes/param in
mixed precision (bf16 params 2 + grads 2 + fp32 master 4 + Adam 8). single/DDP keep all ``16P``; ZeRO-2 keeps
``2P + 14P / N``; FSDP/ZeRO-3 keep ``16P / N`` plus two gathered layers; ZeRO-3-offload keeps ``2P / N`` plus two
gathered layers. Activations per sequence ``34 * s * h * L`` bytes (Korthikanti et al. 2022, flash attention),
``2 * s * h * L + 34 * s * h`` with checkpointing. A strategy with checkpointing ("-ckpt") is offered only when
the plain one does not fit. Options that do not fit even with micro-batch 1 are dropped.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from optuna_saturn.planner import Job, Option

GPU_MEMORY = 80e9
RESERVED = 4e9
PEAK_FLOPS = 312e12
MFU_MAX = 0.45
MFU_HALF_TOKENS = 1024
BUS_BANDWIDTH = 150e9
COLLECTIVE_LATENCY = 20e-6  # seconds per NCCL collective
DDP_BUCKET_BYTES = 25e6  # torch DDP default bucket_cap_mb=25
HBM_BANDWIDTH = 2.0e12  # A100-80GB SXM datasheet: 2,039 GB/s
ADAM_BYTES_PER_PARAM = 28.0
PCIE_BANDWIDTH = 16e9
CPU_ADAM_PARAMS_PER_S = 2e9
OVERLAP = 0.5
STARTUP_SECONDS = 60.0
LOAD_BANDWIDTH = 2e9
WARM_JOB_SECONDS = 10.0
CHECKPOINT_BANDWIDTH = 2e9
POOL_START_SECONDS = STARTUP_SECONDS
PROFILE_STEPS = 7
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

# strategy -> (devices allowed, per-device model-state bytes per param as f(N), bandwidth efficiency, offload)
STRATEGIES = {
    "single": ((1,), lambda n: 16.0, 1.0, False),
    "ddp": ((2, 4, 8), lambda n: 16.0, 1.0, False),
    "zero2": ((2, 4, 8), lambda n: 2.0 + 14.0 / n, 1.0, False),
    "fsdp": ((2, 4, 8), lambda n: 16.0 / n, 1.0, False),
    "zero3": ((2, 4, 8), lambda n: 16.0 / n, 0.9, False),
    "zero3-offload": ((1, 2, 4, 8), lambda n: 2.0 / n, 0.9, True),
}


def _collective(nbytes: float, count: float, efficiency: float) -> float:
    """Seconds for ``count`` collectives moving ``nbytes`` per device in total (alpha-beta model)."""
    return nbytes / (BUS_BANDWIDTH * efficiency) + count * COLLECTIVE_LATENCY


def _communication(strategy: str, model: Model, n: int, efficiency: float) -> tuple[float, float]:
    """(seconds per micro-batch, seconds once per step) of collectives, per the module docstring."""
    if n == 1:
        return 0.0, 0.0
    grads = 2 * model.params  # bf16 bytes of gradients (or parameters)
    ring = (n - 1) / n
    buckets = -(-grads // DDP_BUCKET_BYTES)
    if strategy == "ddp":
        return 0.0, _collective(2 * ring * grads, buckets, efficiency)
    if strategy == "zero2":
        return _collective(ring * grads, buckets, efficiency), _collective(ring * grads, buckets, efficiency)
    # fsdp, zero3, zero3-offload: all-gather (forward), all-gather (backward), reduce-scatter, per layer
    return _collective(3 * ring * grads, 3 * model.layers, efficiency), 0.0


def option_runtime(
    model: Model,
    batch: int,
    strategy: str,
    n: int,
    ckpt: bool,
    *,
    startup: float = STARTUP_SECONDS,
    steps: float | None = None,
) -> float | None:
    """Seconds for the whole trial (``steps`` steps, default the model's training tokens' worth, after ``startup``
    seconds plus the model load), or None if it does not fit in memory even at micro-batch 1."""
    allowed, state_bytes, efficiency, offload = STRATEGIES[strategy]
    if n not in allowed or batch % n:
        return None
    sharded = strategy in ("fsdp", "zero3", "zero3-offload")
    states = state_bytes(n) * model.params + (2 * 2 * model.params / model.layers if sharded else 0.0)
    per_seq = (
        (2 * model.seq * model.hidden * model.layers + 34 * model.seq * model.hidden)
        if ckpt
        else 34 * model.seq * model.hidden * model.layers
    )
    budget = GPU_MEMORY - RESERVED - states
    mb = batch // n
    while mb >= 1 and mb * per_seq > budget:
        mb //= 2
    if mb < 1:
        return None
    steps = model.tokens / (batch * model.seq) if steps is None else steps
    accum = -(-(batch // n) // mb)  # micro-batches per step
    tokens_mb = mb * model.seq
    mfu = MFU_MAX * tokens_mb / (tokens_mb + MFU_HALF_TOKENS)
    compute = 6 * model.params * batch * model.seq / n / (PEAK_FLOPS * mfu) * (4 / 3 if ckpt else 1.0)
    compute_mb = compute / accum
    comm_mb, comm_step = _communication(strategy, model, n, efficiency)
    exposed = (accum - 1) * max(0.0, comm_mb - OVERLAP * compute_mb) + max(
        0.0, comm_mb + comm_step - OVERLAP * compute_mb
    )
    step = compute + exposed
    if offload:
        step += 4 * model.params / n / PCIE_BANDWIDTH + model.params / CPU_ADAM_PARAMS_PER_S
    else:
        local = model.params / n if strategy in ("zero2", "fsdp", "zero3") else model.params
        step += ADAM_BYTES_PER_PARAM * local / HBM_BANDWIDTH
    return startup + 2 * model.params / LOAD_BANDWIDTH + steps * step


def model_options(model: Model, batch: int, **kwargs: float) -> list[Option]:
    """Every memory-feasible (strategy, device count) option; "-ckpt" only where the plain variant does not fit.
    ``kwargs`` go to :func:`option_runtime` (``startup``, ``steps``)."""
    out = []
    for strategy in STRATEGIES:
        for n in DEVICE_COUNTS:
            plain = option_runtime(model, batch, strategy, n, ckpt=False, **kwargs)
            if plain is not None:
                out.append(Option(strategy, n, plain))
                continue
            ckpt = option_runtime(model, batch, strategy, n, ckpt=True, **kwargs)
            if ckpt is not None:
                out.append(Option(f"{'single' if strategy == 'single' else strategy}-ckpt", n, ckpt))
    return out


def paper_like(*, startup: float = STARTUP_SECONDS) -> list[Job]:
    """3 model families x 2 batch sizes x 3 learning rates = 18 trials on one 8 x 80 GB node, each trial starting
    ``startup`` seconds (plus its model load) before its first step."""
    jobs = []
    for model, batches in PAPER_LIKE:
        for batch in batches:
            for lr in LEARNING_RATES:
                jobs.append(Job(f"{model.name}-b{batch}-lr{lr:g}", model_options(model, batch, startup=startup)))
    return jobs


def paper_like_simulated(*, cold: bool, uncertainty: float = 0.3, seed: int = 0) -> list:
    """The paper-like trials as the simulator's jobs (``optuna_saturn.simulation.known_prices.SimulatedJob``), with warm
    workers' start-up (a process group and the model load per trial) and their real step counts. ``cold``: every
    option is predicted off by a seeded factor within ``1 +- uncertainty`` and nothing is measured yet (the
    learning-rate siblings share their profiles); else every option is measured."""
    from optuna_saturn.simulation.known_prices import SimulatedJob
    from optuna_saturn.simulation.pool import Behaviour

    rng = random.Random(seed)
    out = []
    for model, batches in PAPER_LIKE:
        for batch in batches:
            truth = model_options(model, batch, startup=WARM_JOB_SECONDS)
            steps = max(int(model.tokens / (batch * model.seq)), 1)
            startup = WARM_JOB_SECONDS + 2 * model.params / LOAD_BANDWIDTH
            told = (
                [
                    Option(o.strategy, o.devices, o.runtime * rng.uniform(1 / (1 + uncertainty), 1 + uncertainty))
                    for o in truth
                ]
                if cold
                else truth
            )
            for lr in LEARNING_RATES:
                out.append(
                    SimulatedJob(
                        Job(f"{model.name}-b{batch}-lr{lr:g}", told),
                        Behaviour({o.choice: o.runtime for o in truth}, steps=steps, startup=startup),
                        measured=not cold,
                        uncertainty=uncertainty if cold else 0.0,
                        workload=f"{model.name}-b{batch}",
                    )
                )
    return out


def paper_like_restart_seconds() -> dict[str, float]:
    """Per trial of :func:`paper_like`, the seconds an elastic resize costs it (see the module's docstring)."""
    costs = {}
    for model, batches in PAPER_LIKE:
        for batch in batches:
            seconds = (
                2 * 16 * model.params / CHECKPOINT_BANDWIDTH + WARM_JOB_SECONDS + 2 * model.params / LOAD_BANDWIDTH
            )
            for lr in LEARNING_RATES:
                costs[f"{model.name}-b{batch}-lr{lr:g}"] = seconds
    return costs


def noisy_outcomes(jobs: list[Job], seed: int, *, prune_rate: float = 0.3) -> tuple[dict[str, float], dict[str, float]]:
    """What really happens to ``jobs`` in a seeded sweep: each true runtime is the estimate times U(0.8, 1.2), and
    each trial is pruned with probability ``prune_rate`` at U(0.1, 0.6) of its steps. Returns (noise, prune_at)."""
    rng = random.Random(seed)
    noise = {j.name: rng.uniform(0.8, 1.2) for j in jobs}
    prunes = {j.name: rng.uniform(0.1, 0.6) for j in jobs if rng.random() < prune_rate}
    return noise, prunes


def paper_like_profiling_seconds() -> float:
    """Device-seconds to measure every option of every distinct workload of the paper-like sweep once (the
    most a sweep measures: real runs are profiles, and the value-of-information rule skips the rest)."""
    total = 0.0
    for model, batches in PAPER_LIKE:
        for batch in batches:
            for option in model_options(model, batch, startup=WARM_JOB_SECONDS, steps=PROFILE_STEPS):
                total += option.runtime * option.devices
    return total


def paper_like_voi_profiling(*, uncertainty: float = 0.3, seed: int = 0) -> tuple[float, int, int]:
    """Device-seconds the executor's value-of-information rule (``optuna_saturn.pricing.value_of_information``)
    would spend profiling the paper-like sweep, and how many options it measures of how many it could: every option's
    runtime is predicted
    off by a seeded factor within ``1 +- uncertainty`` (the cost model's fitted uncertainty is 0.1-0.3), and each
    option of the first trial of each distinct workload is measured when the plan could gain more than the
    measurement costs, judged once with every trial known. The learning-rate siblings are priced by those
    measurements (the profile key leaves the learning rate out)."""
    from optuna_saturn.planner import Cluster
    from optuna_saturn.pricing.value_of_information import profile_gain, worth_measuring

    rng = random.Random(seed)
    cluster = Cluster([8])
    predicted = [
        Job(
            j.name,
            [
                Option(o.strategy, o.devices, o.runtime * rng.uniform(1 / (1 + uncertainty), 1 + uncertainty))
                for o in j.options
            ],
        )
        for j in paper_like(startup=WARM_JOB_SECONDS)
    ]
    spent, measured, candidates = 0.0, 0, 0
    for model, batches in PAPER_LIKE:
        for batch in batches:
            name = f"{model.name}-b{batch}-lr{LEARNING_RATES[0]:g}"
            job = next(j for j in predicted if j.name == name)
            costs = {
                (o.strategy, o.devices): o.runtime
                for o in model_options(model, batch, startup=WARM_JOB_SECONDS, steps=PROFILE_STEPS)
            }
            for option in job.options:
                candidates += 1
                gain = profile_gain(predicted, cluster, name, option.choice, option.runtime / (1 + uncertainty))
                cost = costs[(option.strategy, option.devices)]
                if worth_measuring(gain, cost, option.devices, cluster):
                    spent += cost * option.devices
                    measured += 1
    return spent, measured, candidates


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


def arm_in_a_process(script: str, *args: str) -> dict:
    """Run one arm of a benchmark as ``python script --arm ... args`` in a fresh process (it pays its own imports
    and start-up) and return the JSON it prints last."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


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
        opts = ", ".join(
            f"{o.strategy}x{o.devices}: {o.runtime:.0f}"
            for o in sorted(job.options, key=lambda o: (o.devices, o.runtime))
        )
        print(f"| {job.name.rsplit('-lr', 1)[0]} | {opts} |")
