"""Three small deadline cases in the real-loop simulator (planning by work: the same figures on any machine), the
ones ``tests/test_objectives.py`` checks, with their figures printed:

1. **A node given back.** Two trials that scale poorly (8 devices 3x faster than 1) on two nodes of 8 devices, a
   deadline of 1.3x the makespan mode's end: when each node went back, and the device-seconds the pool held,
   against the makespan mode's.
2. **Not refused on the heuristics' word.** Six such trials (seeded sizes) on one node of 4: deadlines of 1.05x and
   1.1x the makespan mode's end, met or refused, and the end.
3. **The whole sweep counts.** 24 trials of 100 s on 2 devices, a deadline of 600 s (their first 8 fit in it):
   refused, with the earliest end.

Usage: ``python benchmarks/deadline_cases.py``."""

from __future__ import annotations

import random

import _common  # noqa: F401

from optuna_saturn.planner import Cluster, Deadline, DeadlineUnreachable, Goal, Job, Makespan, Option, device_seconds
from optuna_saturn.simulation.known_prices import SimulatedJob
from optuna_saturn.simulation.pool import Behaviour
from optuna_saturn.simulation.simulator import run_simulation


def simulated(jobs: list[Job]) -> list[SimulatedJob]:
    return [SimulatedJob(j, Behaviour({o.choice: o.runtime for o in j.options})) for j in jobs]


def run(jobs: list[Job], cluster: Cluster, goal: Goal | None = None) -> dict:
    try:
        result = run_simulation(simulated(jobs), cluster, solver="auto", work_limit=2.0, goal=goal or Makespan())
    except DeadlineUnreachable as refused:
        return {"refused": str(refused), "earliest_end": refused.earliest_end}
    return {**result.info, "trials_device_seconds": device_seconds(result.executed)}


def scaling(size: float = 1.0) -> list[Option]:
    shape = {1: 900.0, 2: 520.0, 4: 380.0, 8: 300.0}
    return [Option("ddp" if n > 1 else "single", n, t * size) for n, t in shape.items()]


def main() -> None:
    jobs = [Job(str(i), scaling()) for i in range(2)]
    fastest = run(jobs, Cluster([8, 8]))
    relaxed = run(jobs, Cluster([8, 8]), Deadline(1.3 * fastest["wall_seconds"]))
    given = sorted({(name.split("/")[0], at) for name, at in relaxed["released"].items()})
    print(f"1. makespan mode: ends at {fastest['wall_seconds']:.0f} s, the pool held "
          f"{fastest['held_device_seconds']:.0f} device-s; deadline 1.3x: ends at {relaxed['wall_seconds']:.0f} s, "
          f"the pool held {relaxed['held_device_seconds']:.0f} device-s; given back (node, at s): {given}")  # fmt: skip
    rng = random.Random(5)
    jobs = [Job(str(i), [o for o in scaling(rng.uniform(1.0, 3.0)) if o.devices <= 4]) for i in range(6)]
    fastest = run(jobs, Cluster([4]))
    end = fastest["wall_seconds"]
    for factor in (1.05, 1.1):
        out = run(jobs, Cluster([4]), Deadline(factor * end))
        said = out.get("refused") or (
            f"met: ends at {out['wall_seconds']:.0f} s, the trials held {out['trials_device_seconds']:.0f} "
            f"device-s, the pool {out['held_device_seconds']:.0f}"
        )
        print(
            f"2. makespan mode ends at {end:.0f} s (the trials held {fastest['trials_device_seconds']:.0f} device-s); "
            f"deadline {factor}x ({factor * end:.0f} s): {said}"
        )
    jobs = [Job(str(i), [Option("single", 1, 100.0)]) for i in range(24)]
    out = run(jobs, Cluster([2]), Deadline(600.0))
    print(f"3. 24 trials of 100 s on 2 devices, deadline 600 s: {out.get('refused') or out}")


if __name__ == "__main__":
    main()
