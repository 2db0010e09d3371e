"""The Hugging Face Trainer way against a plain Trainer in one process: the value each gives, per seed.

The tests' Trainer objective (a two-layer GPT-2 from a config: AdamW, warm-up and linear decay, clipping, shuffled
data, an evaluation every 3 steps) with a given dropout, for several seeds of the Trainer (``seed=``):

- **plain**: the objective in this process, with a plain trial (``prepare_trainer`` hands the Trainer back);
- **single**, **ddp** (2 CPU devices): the objective as an optuna-saturn trial under that strategy.

Reported per seed: each value (``trainer.evaluate()["eval_loss"]``), and each strategy's relative difference to
plain; then, over the seeds, the largest such difference against the seed-to-seed spread of plain's value (its
standard deviation over the seeds, relative to its mean): what a strategy changes, next to what a seed changes.

    python benchmarks/trainer_parity.py [--dropout 0.1] [--seeds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import _common  # noqa: F401  (the repository on sys.path)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import hf_objectives
import optuna
import torch
from support import run_on

PARAMS = {"learning_rate": 3e-3}


class PlainTrial(optuna.trial.FixedTrial):
    device = torch.device("cpu")

    def prepare_trainer(self, trainer, **kwargs):
        return trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dropout", default="0.1")
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    os.environ["SATURN_TEST_DROPOUT"] = args.dropout
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logs = tempfile.mkdtemp(prefix="trainer-parity-")
    rows = []
    for seed in range(args.seeds):
        os.environ["SATURN_TEST_SEED"] = str(seed)
        plain = hf_objectives.trainer_gpt2(PlainTrial(PARAMS))
        values = {"plain": plain}
        for strategy, devices in (("single", 1), ("ddp", 2)):
            (trial,) = run_on(hf_objectives.trainer_gpt2, strategy, devices, logs, params=PARAMS).trials
            values[strategy] = trial.value
        rows.append(values)
        print(
            f"seed {seed}: plain {plain:.6f}, single {values['single']:.6f} ({values['single'] / plain - 1:+.2e}), "
            f"ddp {values['ddp']:.6f} ({values['ddp'] / plain - 1:+.2e})",
            flush=True,
        )
    plains = [r["plain"] for r in rows]
    spread = statistics.stdev(plains) / statistics.mean(plains) if len(plains) > 1 else float("nan")
    for strategy in ("single", "ddp"):
        worst = max(abs(r[strategy] / r["plain"] - 1) for r in rows)
        print(f"{strategy}: largest relative difference to plain {worst:.2e}; seed-to-seed spread {spread:.2e}")


if __name__ == "__main__":
    main()
