"""The strategy is optuna-saturn's choice, so it must not change a trial's result: the example's trial (lr 2e-3,
n_embd 32, 1 layer, batch 16) as trial 0 of a fresh study under each strategy, its value against ``single``'s.

    unshare -n sh -c 'ip link set lo up && exec "$@"' sh python benchmarks/strategy_invariance.py
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import _common

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(_common.ROOT / "examples"))

import gpt2_sweep
import optuna
from workloads import markdown_table

from optuna_saturn import SaturnExecutor, load_strategies

EXAMPLE_TRIAL = {"lr": 2e-3, "n_embd": 32, "n_layer": 1, "batch_size": 16}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategies", default=",".join(sorted(load_strategies())))
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rows, reference = [], None
    with tempfile.TemporaryDirectory() as logs:
        for name in ["single"] + [s for s in args.strategies.split(",") if s != "single"]:
            study = optuna.create_study(pruner=optuna.pruners.NopPruner())
            study.enqueue_trial(EXAMPLE_TRIAL)
            SaturnExecutor(
                devices=1 if name.startswith("single") else 2,
                strategies=[name],
                profile=False,
                progress=None,
                dashboard=False,
                log_dir=logs,
            ).optimize(study, gpt2_sweep.objective, n_trials=1)
            trial = study.trials[0]
            reference = trial.value if reference is None else reference
            relative = abs(trial.value - reference) / abs(reference) if trial.value is not None else float("nan")
            rows.append(
                [
                    name,
                    trial.system_attrs.get("saturn:num_devices"),
                    trial.state.name,
                    f"{trial.value!r}",
                    f"{relative:.1e}",
                ]
            )
            print(" ".join(map(str, rows[-1])), file=sys.stderr, flush=True)
    print(markdown_table(["strategy", "devices", "state", "value", "relative to single"], rows))


if __name__ == "__main__":
    main()
