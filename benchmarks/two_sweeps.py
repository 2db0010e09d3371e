"""Two sweeps on one machine, on the same devices, round after round (issue 38's target): no device ever runs two
trials at once, both sweeps complete every trial, and killing one with ``kill -9`` frees its devices to the other
within 5 s.

Each round starts two ``optuna-saturn run`` sweeps at once, on two studies of one SQLite file, both on the same 2
CPU devices, with device leases on (``optuna_saturn.leases``). One of them (they take turns) is killed with
``kill -9`` at a seeded random moment while it holds the devices; the time until the other holds them is
measured from the lease files. The killed sweep is then run again (as a user would), which recovers its
orphans and runs them again. At the end, the per-device log of every trial's start and end (its
``saturn:devices``, ``datetime_start`` and ``datetime_complete``) is checked for overlaps across the two studies.

Usage: ``python benchmarks/two_sweeps.py [--rounds 10] [--seed 0]`` (root, for the loopback-only network
namespaces each launch runs in).
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401
import optuna
from optuna.trial import TrialState

from optuna_saturn.leases import LEASES_ENV, current_leases

TESTS = Path(__file__).resolve().parent.parent / "tests"
STEPS = 40  # a trial: 40 steps of 0.1 s (tests/objectives.py: sleepy)


def start(storage: str, study: str, trials: int, folder: Path, leases: Path) -> subprocess.Popen:
    command = [os.path.join(os.path.dirname(sys.executable), "optuna-saturn"), "run", "objectives:sleepy"]
    command += ["--storage", storage, "--study", study, "--devices", "2", "--strategies", "single"]
    command += ["--n-trials", str(trials), "--no-profile", "--progress", "plain", "--no-dashboard"]
    command += ["--isolate-network", "--log-dir", str(folder / "runs")]
    environment = {
        **os.environ,
        LEASES_ENV: str(leases),
        "SATURN_TEST_SLEEPY_STEPS": str(STEPS),
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    with open(folder / f"{study}-{time.monotonic_ns()}.out", "w") as out:
        return subprocess.Popen(command, env=environment, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def running(storage: str, study: str) -> list:
    try:
        return optuna.load_study(study_name=study, storage=storage).get_trials(states=(TrialState.RUNNING,))
    except Exception:  # (not created yet, or the file locked for a moment)
        return []


def holders(leases: Path) -> set[str]:
    return {holder.study for _, holder in current_leases(leases) if holder is not None}


def until(condition, seconds: float) -> float | None:
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > seconds:
            return None
        time.sleep(0.02)
    return time.monotonic() - began


def overlaps(storage: str, studies: list[str]) -> int:
    """Pairs of trials of different studies that ran on one device at the same time."""
    runs: dict[str, list[tuple[float, float, str]]] = {}
    for name in studies:
        for trial in optuna.load_study(study_name=name, storage=storage).trials:
            if trial.datetime_start is None or "saturn:devices" not in trial.system_attrs:
                continue
            end = (trial.datetime_complete or trial.datetime_start).timestamp()
            for device in trial.system_attrs["saturn:devices"]:
                runs.setdefault(device, []).append((trial.datetime_start.timestamp(), end, name))
    count = 0
    for device_runs in runs.values():
        device_runs.sort()
        for (_, end, name), (start_, _, other) in itertools.pairwise(device_runs):
            count += name != other and start_ < end
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    folder = Path(tempfile.mkdtemp(prefix="saturn-two-sweeps-"))
    leases = folder / "leases"
    storage = f"sqlite:///{folder / 'studies.sqlite3'}"
    optuna.storages.RDBStorage(storage)  # (its tables, made once: two sweeps that start together both would)
    print("| round | killed | killed after its trials started (s) | freed to the other in (s) | complete | wall (s) |")
    print("|---|---|---|---|---|---|")
    freed_all, complete_all, waited_all = [], True, True
    for round_ in range(args.rounds):
        began = time.monotonic()
        names = [f"a{round_}", f"b{round_}"]
        sweeps = {name: start(storage, name, 2, folder, leases) for name in names}
        until(lambda: bool(holders(leases)), 120)
        first = next(iter(holders(leases)), None)
        other = next(name for name in names if name != first)
        until(lambda first=first: bool(running(storage, first)), 120)
        after = rng.uniform(0.0, STEPS / 10 / 2)  # somewhere in its trials (each takes STEPS / 10 s)
        time.sleep(after)
        killed_at = time.time()
        os.killpg(sweeps[first].pid, signal.SIGKILL)
        sweeps[first].wait()
        freed = until(lambda other=other: holders(leases) == {other}, 60)
        freed_all.append(freed if freed is not None else float("inf"))
        sweeps[other].wait(timeout=600)
        asked = [
            t
            for t in optuna.load_study(study_name=first, storage=storage).trials
            if "saturn:retry_of" not in t.user_attrs
        ]
        again = start(storage, first, 2 - len(asked), folder, leases)  # (recovers its orphans, asks what it owes)
        again.wait(timeout=600)
        done = {n: [t.state for t in optuna.load_study(study_name=n, storage=storage).trials] for n in names}
        complete = all(states.count(TrialState.COMPLETE) == 2 for states in done.values())
        complete &= not any(TrialState.RUNNING in states or TrialState.WAITING in states for states in done.values())
        others = optuna.load_study(study_name=other, storage=storage).trials
        waited = all(t.datetime_start.timestamp() > killed_at for t in others)  # (it ran nothing beside the first)
        waited_all &= waited
        complete_all &= complete
        shown = f"{freed:.2f}" if freed is not None else "not freed"
        print(
            f"| {round_} | {first} | {after:.1f} | {shown} | {complete} | {time.monotonic() - began:.0f} |", flush=True
        )
    studies = [f"{x}{r}" for r in range(args.rounds) for x in "ab"]
    overlapping = overlaps(storage, studies)
    print(f"\nper-device log: {overlapping} overlap(s) of two studies' trials on one device (runs that were told)")
    print(f"the waiting sweep started every trial after the holder was killed, in every round: {waited_all}")
    print(f"freed in at most {max(freed_all):.2f} s; every trial complete in every round: {complete_all}")
    ok = overlapping == 0 and complete_all and waited_all and max(freed_all) < 5.0
    print("PASS" if ok else "FAIL")


if __name__ == "__main__":
    main()
