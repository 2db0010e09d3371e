"""Two Python environments alternating zero2 sweeps on one machine: does either build DeepSpeed's op inside a
trial after its first sweep, and is any trial stopped as a stall? (issue 47's target for the extensions cache)

The second environment is this one under another path (a symlink to its folder: the same versions, other paths
in the build files), which is the case a cache keyed by versions alone gets wrong. Both use the default cache,
under a private ``HOME``, so the machine's own cache is left alone. Each sweep runs one zero2 trial on 2 CPU
devices; a build inside a trial is an op library written during the sweep without the pool's "Building" warning.

    python benchmarks/two_environments.py --rounds 5    # about 4 min of builds, then ~30 s a sweep on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SWEEP = """
import json, os, sys, time, optuna, torch
from optuna_saturn import SaturnExecutor
from optuna_saturn.pools.launch_commands import extensions_cache

def objective(trial):
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    model, optimizer, loader = trial.prepare(model, optimizer, torch.utils.data.DataLoader(data, batch_size=8))
    batches = iter(loader)
    for _ in trial.steps(5):
        x, y = next(batches)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x.to(trial.device)), y.to(trial.device))
        trial.backward(loss)
        optimizer.step()
    return trial.reduce_mean(loss)

optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.create_study()
SaturnExecutor(devices=2, strategies=["zero2"], progress="quiet", profile=False, stall_timeout=60,
               max_retries=0).optimize(study, objective, n_trials=1)
t = study.trials[0]
print(json.dumps({"folder": str(extensions_cache("cpu")), "state": t.state.name,
                  "reason": t.system_attrs.get("saturn:fail_reason", "")}))
"""


def library_time(folder: Path) -> float | None:
    try:
        return (folder / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").stat().st_mtime
    except FileNotFoundError:
        return None


def sweep(python: str, home: Path, work: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_EXTENSIONS_DIR", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(HOME=str(home), PYTHONPATH=str(ROOT), OPTUNA_SATURN_LEASES="off")
    began = time.time()
    done = subprocess.run([python, "-c", SWEEP], env=env, cwd=work, capture_output=True, text=True, check=False)
    result = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {"state": "ERROR"}
    result.update(seconds=round(time.time() - began, 1), prebuilt="Building DeepSpeed's" in done.stderr)
    if done.returncode != 0:
        result["reason"] = done.stderr[-2000:]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="saturn-two-envs."))
    home, work = scratch / "home", scratch / "work"
    home.mkdir()
    work.mkdir()
    venv = Path(sys.prefix)
    other = scratch / "other-env"
    other.symlink_to(venv, target_is_directory=True)  # (the same environment under another path)
    pythons = {"A": str(venv / "bin" / "python"), "B": str(other / "bin" / "python")}
    seen: dict[str, int] = {"A": 0, "B": 0}
    in_trial = stalls = 0
    for round_ in range(1, args.rounds + 1):
        for name, python in pythons.items():
            before = {f: library_time(f) for f in home.glob(".cache/optuna-saturn/torch_extensions/*")}
            result = sweep(python, home, work)
            folder = Path(result.get("folder", home))
            built = library_time(folder) != before.get(folder)
            inside = built and not result["prebuilt"]
            seen[name] += 1
            in_trial += inside and seen[name] > 1
            stalls += "no progress" in result.get("reason", "")
            print(
                f"round {round_} env {name}: {result['state']} in {result['seconds']} s, op built before the pool: "
                f"{result['prebuilt']}, built inside the trial: {inside}, folder {folder.name} "
                f"{result.get('reason', '')[:200]}",
                flush=True,
            )
    print(f"builds inside a trial after each environment's first sweep: {in_trial}; stalls: {stalls}")
    return 0 if in_trial == 0 and stalls == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
