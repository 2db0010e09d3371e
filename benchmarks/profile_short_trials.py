"""Where the executor's time goes on short trials: ``cProfile`` of its process over one sweep of
``benchmarks/short_trials.py``'s objective, then each device's gaps between trials and the sweep's start.

    python benchmarks/profile_short_trials.py [N_TRIALS] [plain|steps] [STORAGE_URL]

Prints the profile's top 45 entries by cumulative time (the loop's ``_ask``, ``_ended``, ``_dispatch``, a
tell's ``_tell_now``), the median gap between two trials on a device and a trial's median runtime (0.2 s of
sleep and the bookkeeping inside it), and when the workers were ready.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ["SHORT_TRIAL_SECONDS"] = "0.2"
os.environ.setdefault("OPTUNA_SATURN_LEASES", "off")

import optuna
import short_trials

from optuna_saturn import SaturnExecutor
from optuna_saturn.study.records import records


def main() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    work = tempfile.mkdtemp()
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    objective = short_trials.steps_objective if sys.argv[2:3] == ["steps"] else short_trials.plain_objective
    storage = sys.argv[3] if len(sys.argv) > 3 else f"sqlite:///{work}/study.sqlite3"
    study = optuna.create_study(storage=storage, study_name=f"profile-{time.time():.0f}")
    executor = SaturnExecutor(devices=2, log_dir=work + "/runs", profile_store=work + "/profiles", progress=None)
    profile = cProfile.Profile()
    began = time.perf_counter()
    profile.enable()
    executor.optimize(study, objective, n_trials=n)
    profile.disable()
    print(f"optimize: {time.perf_counter() - began:.1f} s")
    pstats.Stats(profile).sort_stats("cumulative").print_stats(45)
    by_device: dict[tuple, list[tuple[float, float]]] = {}
    for trial in study.trials:
        attrs = records(trial)
        by_device.setdefault(tuple(attrs["device_ids"]), []).append((attrs["actual_start"], attrs["actual_end"]))
    gaps = [
        later[0] - earlier[1] for runs in by_device.values() for earlier, later in zip(sorted(runs), sorted(runs)[1:])
    ]
    runtimes = [end - start for runs in by_device.values() for start, end in runs]
    print(f"median gap between trials on a device: {statistics.median(gaps) * 1e3:.0f} ms")
    print(f"median trial runtime: {statistics.median(runtimes) * 1e3:.0f} ms")
    print(f"workers ready: {study.user_attrs['saturn:last_sweep'].get('workers_ready')}")


if __name__ == "__main__":
    main()
