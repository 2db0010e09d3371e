"""DeepSpeedCPUAdam against torch's Adam/AdamW on the CPU, where ZeRO-Offload steps the optimizer: the same values
(the swap in ``optuna_saturn/engines/_offload_optimizer.py`` must keep the trial's values within the 1e-4 the
strategy-invariance tests allow), and the step's time on one core.

    TORCH_EXTENSIONS_DIR=/tmp/ds_ext python benchmarks/offload_optimizer.py

Builds DeepSpeed's ``cpu_adam`` op into ``TORCH_EXTENSIONS_DIR`` the first time (about 2 min on 2 cores). Prints a
markdown table.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

STEPS = 40
TOLERANCE = 1e-4  # tests/test_strategies_real.py LOSS_TOLERANCE, tests/test_hf_ways_in.py TOLERANCE


def losses(make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]) -> list[float]:
    """A small MLP's losses over ``STEPS`` steps under a warm-up schedule (made on the optimizer, as users do)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 1)
    )
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=generator)
    y = x.sum(1, keepdim=True).sin()
    optimizer = make(list(model.parameters()))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 5))
    seen = []
    for step in range(STEPS):
        rows = slice((step % 16) * 16, (step % 16) * 16 + 16)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[rows]), y[rows])
        loss.backward()
        optimizer.step()
        schedule.step()
        seen.append(loss.item())
    return seen


def step_ms(optimizer_class: type, n: int, **kwargs: object) -> float:
    parameter = torch.nn.Parameter(torch.randn(n))
    parameter.grad = torch.randn(n)
    optimizer = optimizer_class([parameter], lr=1e-3, weight_decay=0.01, **kwargs)
    optimizer.step()  # (state made)
    started = time.perf_counter()
    for _ in range(5):
        optimizer.step()
    return (time.perf_counter() - started) / 5 * 1000


def main() -> None:
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    torch.set_num_threads(1)
    print("| optimizer | worst relative loss difference over 40 steps | within 1e-4 |\n|---|---|---|")
    for name, torch_class, decay, adamw in (
        ("AdamW, weight decay 0.01", torch.optim.AdamW, 0.01, True),
        ("Adam", torch.optim.Adam, 0.0, False),
        ("Adam, L2 0.01", torch.optim.Adam, 0.01, False),
    ):
        reference = losses(lambda p, c=torch_class, d=decay: c(p, lr=3e-3, weight_decay=d))
        swapped = losses(lambda p, d=decay, w=adamw: DeepSpeedCPUAdam(p, lr=3e-3, weight_decay=d, adamw_mode=w))
        worst = max(abs(a - b) / abs(b) for a, b in zip(swapped, reference))
        print(f"| {name} | {worst:.1e} | {worst <= TOLERANCE} |")
    print("\n| parameters | torch AdamW (ms/step, 1 core) | DeepSpeedCPUAdam (ms/step, 1 core) |\n|---|---|---|")
    for n in (10_000_000, 50_000_000):
        ours, theirs = step_ms(torch.optim.AdamW, n), step_ms(DeepSpeedCPUAdam, n, adamw_mode=True)
        print(f"| {n / 1e6:.0f} M | {ours:.0f} | {theirs:.0f} |")


if __name__ == "__main__":
    main()
