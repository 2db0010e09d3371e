"""GPU check of the strategies and the profiler: a GPT-2-medium-sized model (355 M parameters, built from a config)
profiled under every strategy that can run on the devices at hand, through the same executor a sweep uses.

Prints, per strategy: whether it fits, how many micro-batches it needed, step time, start-up, time after the loop
and peak memory (``max_memory_allocated`` on GPU, peak RSS on CPU); strategies that need more devices than the
machine has are listed as such. The profiles land in ``profiles/reference/`` (``--store``) and a JSON summary in
``$OUT/gpu_profile_check.json`` when ``OUT`` is set.

    python benchmarks/gpu_profile_check.py            # one GPU: ~5 min, most of it DeepSpeed's first compile
    python benchmarks/gpu_profile_check.py --tiny     # the same path on CPU with a small model (tests the script)

Data are random token ids: speed and memory do not depend on the text.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import optuna
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import _common  # noqa: E402,F401

from optuna_saturn import SaturnExecutor, load_strategies  # noqa: E402

#: GPT-2-medium: 24 layers, width 1024, 16 heads, 1024 positions; the global batch and steps of a short run.
MEDIUM = {"n_embd": 1024, "n_layer": 24, "n_head": 16, "n_positions": 1024, "vocab_size": 50257, "batch": 8}
TINY = {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64, "vocab_size": 1000, "batch": 8}
STEPS = 50


def model_size() -> dict:
    """Read when used, not at import: ``--tiny`` reaches the workers (and the dry run) through the environment."""
    return TINY if os.environ.get("SATURN_GPU_CHECK_TINY") else MEDIUM


def objective(trial) -> float:
    """One fixed configuration; bf16 autocast on GPU (what a user would run), float32 on CPU."""
    from transformers import GPT2Config, GPT2LMHeadModel

    size = model_size()
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=size["vocab_size"],
        n_positions=size["n_positions"],
        n_embd=size["n_embd"],
        n_layer=size["n_layer"],
        n_head=size["n_head"],
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=trial.suggest_float("lr", 1e-4, 1e-4))
    ids = torch.randint(0, size["vocab_size"], (size["batch"] * 4, size["n_positions"]))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=size["batch"], drop_last=True)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    batches = iter(loader)
    loss = torch.zeros(())
    for _ in trial.steps(STEPS):
        try:
            (x,) = next(batches)
        except StopIteration:
            batches = iter(loader)
            (x,) = next(batches)
        optimizer.zero_grad()
        for part in trial.micro_batches(x.to(trial.device)):
            with torch.autocast(trial.device.type, dtype=torch.bfloat16, enabled=trial.device.type == "cuda"):
                loss = model(input_ids=part, labels=part).loss
            trial.backward(loss)
        optimizer.step()
    return trial.reduce_mean(loss.detach())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a small model, for a CPU run of the same path")
    parser.add_argument("--devices", default="auto", help="'auto' (every GPU, else every core) or a number")
    parser.add_argument("--store", default=str(HERE.parent / "profiles" / "reference"))
    parser.add_argument(
        "--no-isolate-network",
        dest="isolate",
        action="store_false",
        help="launch without a loopback-only network namespace (when unshare is not allowed)",
    )
    args = parser.parse_args()
    if args.tiny:  # workers import this module: the size must reach them through the environment
        os.environ["SATURN_GPU_CHECK_TINY"] = "1"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    devices = int(args.devices) if args.devices.isdigit() else args.devices
    executor = SaturnExecutor(
        devices=devices,
        profile_store=args.store,
        isolate_network=args.isolate,
        progress="plain",
        dashboard=False,
        log_dir=os.path.join(os.environ.get("OUT", "."), "gpu-check-runs"),
    )
    pool = len(executor.devices)
    size = model_size()
    study = executor.profile(objective, n_trials=1)
    trial = study.trials[0]
    rows = trial.system_attrs.get("saturn:profiles", [])
    unavailable = sorted(s.name for s in load_strategies().values() if not s.device_counts(pool))
    print(
        f"\n{'tiny model' if args.tiny else 'GPT-2-medium'} on {', '.join(map(str, executor.devices))}; "
        f"global batch {size['batch']} x {size['n_positions']} tokens\n"
    )
    print("| strategy | devices | micro-batches | fits | ms/step | start-up (s) | after loop (s) | peak memory (GiB) |")
    print("|---|---|---|---|---|---|---|---|")
    for p in sorted(rows, key=lambda p: (p["devices"], p["strategy"], p.get("gradient_accumulation", 1))):
        ok = p["feasible"]
        print(
            f"| {p['strategy']} | {p['devices']} | {p.get('gradient_accumulation', 1)} | {'yes' if ok else 'no'} | "
            + (
                f"{1e3 * p['step_seconds']:.1f} | {p['startup_seconds']:.1f} | {p.get('tail_seconds') or 0:.1f} | "
                f"{p['peak_memory_bytes'] / 2**30:.2f} |"
                if ok
                else f"- | - | - | {p.get('error', '')[:60]} |"
            )
        )
    if unavailable:
        print(f"\nNeed more than {pool} device(s): {', '.join(unavailable)}")
    if os.environ.get("OUT"):
        summary = {
            "size": size,
            "pool": pool,
            "profiles": rows,
            "unavailable": unavailable,
            "options": trial.system_attrs.get("saturn:options", []),
        }
        Path(os.environ["OUT"], "gpu_profile_check.json").write_text(json.dumps(summary, indent=1))
    if not any(p["feasible"] for p in rows):
        raise SystemExit("No strategy could be profiled; see the logs under gpu-check-runs/.")


if __name__ == "__main__":
    main()
