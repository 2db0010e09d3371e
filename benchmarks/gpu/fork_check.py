"""The forked pool host on a GPU: after ``torch.cuda.is_available()`` in the executor's process, does a one-trial
sweep of ``tests/objectives.same_curve`` complete (``profile=False``, so nothing else touches CUDA first)?

    python benchmarks/gpu/fork_check.py fixed   # the code as it is: the host must not be a fork
    python benchmarks/gpu/fork_check.py old     # cuda_driver_loaded forced False: the behaviour before the fix
"""

from __future__ import annotations

import glob
import os
import sys
import time
from pathlib import Path

sys.path[:0] = [os.path.join(os.getcwd(), "tests")]

import objectives  # noqa: E402
import optuna  # noqa: E402
import torch  # noqa: E402

from optuna_saturn import SaturnExecutor  # noqa: E402
from optuna_saturn.devices import Device  # noqa: E402
from optuna_saturn.pools import forked_host  # noqa: E402


def main(mode: str) -> None:
    print(
        f"[{mode}] torch.cuda.is_available() = {torch.cuda.is_available()}; is_initialized = "
        f"{torch.cuda.is_initialized()}; cuda_driver_loaded() = {forked_host.cuda_driver_loaded()}"
    )
    if mode == "old":
        forked_host.cuda_driver_loaded = lambda: False
    print(f"[{mode}] why_not_fork = {forked_host.why_not_fork([Device('cuda', 0)])!r}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logs = f"/tmp/fork-check-{mode}"
    study = optuna.create_study()
    started = time.time()
    SaturnExecutor(
        devices=[0],
        strategies=["single"],
        profile=False,
        log_dir=logs,
        max_retries=0,
        progress="quiet",
        dashboard=False,
    ).optimize(study, objectives.same_curve, n_trials=1)
    trial = study.trials[0]
    print(
        f"[{mode}] trial 0: {trial.state.name} in {time.time() - started:.1f} s; value {trial.value}; "
        f"fail_reason {trial.system_attrs.get('saturn:fail_reason')!r}; losses {trial.user_attrs.get('losses')}"
    )
    for log in sorted(glob.glob(f"{logs}/*/trial-*.log")):
        print(f"----- {log}\n" + Path(log).read_text()[-3000:])


if __name__ == "__main__":
    main(sys.argv[1])
