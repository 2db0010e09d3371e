"""Planning for a deadline or a budget, in the real-loop simulator (planning by work: the same figures on any
machine), on the paper-like workload (18 trials, one 8-device node; ``workloads.paper_like_simulated``, cold store:
options predicted off by up to 30%, seeded), on the same trials spread over four such nodes (32 devices), and on
8 poorly scaling trials on those 32 devices.

For each seed: the makespan mode's end ``E`` and device-hours; a deadline of 1.3 E (met? device-hours saved, of the
trials' and of the pool's, which gives idle nodes back at the tail);
a budget of the makespan mode's device-hours minus 15% (held? the end it reaches). Device-hours are what the trials
held devices for (devices x runtime), the least any plan can spend being every trial on its cheapest option (the
"floor" column). Then the curve of device-hours against the deadline (seed 0), as a PNG.

Usage: ``python benchmarks/deadlines.py [--seeds 5] [--png docs/deadline-curve.png]``."""

from __future__ import annotations

import argparse
import statistics

import _common  # noqa: F401
from workloads import POOL_START_SECONDS, markdown_table, paper_like_simulated

from optuna_saturn.planner import Budget, Cluster, Deadline, DeadlineUnreachable, Goal, Makespan, device_seconds
from optuna_saturn.simulation.simulator import run_simulation


def poorly_scaling(seed: int) -> list:
    """8 trials whose 8-device runs are only 3x faster than one device's (2.7x the device-seconds), each 1-3x
    longer (seeded), measured: where a deadline has room, their efficient options save most."""
    import random

    from optuna_saturn.planner import Job, Option
    from optuna_saturn.simulation.known_prices import SimulatedJob
    from optuna_saturn.simulation.pool import Behaviour

    rng, shape = random.Random(seed), {1: 900.0, 2: 520.0, 4: 380.0, 8: 300.0}
    out = []
    for i in range(8):
        size = rng.uniform(1.0, 3.0)
        options = [Option("ddp" if n > 1 else "single", n, t * size) for n, t in shape.items()]
        out.append(SimulatedJob(Job(f"t{i}", options), Behaviour({o.choice: o.runtime for o in options})))
    return out


#: (the trials of a seed, the cluster): the paper-like ones on one node and on four, and poorly scaling ones.
CASES = {
    "paper-like, 1 node x 8": (lambda seed: paper_like_simulated(cold=True, seed=seed), Cluster([8])),
    "paper-like, 4 nodes x 8": (lambda seed: paper_like_simulated(cold=True, seed=seed), Cluster([8, 8, 8, 8])),
    "8 poorly scaling trials, 4 nodes x 8": (poorly_scaling, Cluster([8, 8, 8, 8])),
}
FACTORS = (1.0, 1.1, 1.2, 1.3, 1.5, 1.75, 2.0, 2.5, 3.0)


def simulate(jobs: list, cluster: Cluster, goal: Goal) -> tuple[float, float, float] | None:
    """(end, device-hours the trials held, device-hours the pool held) of the simulated sweep, or None if its
    deadline was refused. The pool holds every device from the start to the end, or to when it gave the device's
    node back (under a deadline or a budget, once no trial left needs it): what a cluster bills."""
    try:
        result = run_simulation(jobs, cluster, solver="auto", workers_ready=POOL_START_SECONDS, tick=60.0, goal=goal)
    except DeadlineUnreachable:
        return None
    return (
        result.info["wall_seconds"],
        device_seconds(result.executed) / 3600,
        result.info["held_device_seconds"] / 3600,
    )


def floor_hours(jobs: list) -> float:
    """The fewest device-hours any plan spends: each trial on its cheapest option (its true runtimes)."""
    return sum(min(c[1] * t for c, t in j.behaviour.runtimes.items()) for j in jobs) / 3600


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--png", default=None, help="where to write the curve of device-hours against deadline")
    args = parser.parse_args()
    for name, (trials, cluster) in CASES.items():
        rows, saved, pool_saved, held = [], [], [], []
        for seed in range(args.seeds):
            jobs = trials(seed)
            end, hours, pool_hours = simulate(jobs, cluster, Makespan()) or (0.0, 0.0, 0.0)
            deadline = simulate(jobs, cluster, Deadline(1.3 * end))
            budget = simulate(jobs, cluster, Budget(0.85 * hours * 3600))
            d_end, d_hours, d_pool = deadline or (float("nan"),) * 3
            b_end, b_hours, _ = budget or (float("nan"),) * 3
            saved.append(1 - d_hours / hours)
            pool_saved.append(1 - d_pool / pool_hours)
            held.append(b_hours <= 0.85 * hours)
            rows.append(
                [
                    seed,
                    end / 3600,
                    hours,
                    floor_hours(jobs),
                    d_end / 3600,
                    "yes" if d_end <= 1.3 * end else "NO",
                    d_hours,
                    f"{100 * (1 - d_hours / hours):.1f}%",
                    pool_hours,
                    d_pool,
                    f"{100 * (1 - d_pool / pool_hours):.1f}%",
                    b_hours,
                    "yes" if b_hours <= 0.85 * hours else "no",
                    b_end / 3600,
                ]
            )
        print(f"\n{name} ({cluster.total_devices} devices)\n")
        headers = [
            "seed",
            "makespan mode: end (h)",
            "device-h",
            "floor device-h",
            "deadline 1.3x: end (h)",
            "met",
            "device-h",
            "saved",
            "pool's device-h: makespan mode",
            "deadline 1.3x",
            "saved",
            "budget -15%: device-h",
            "held",
            "end (h)",
        ]
        print(markdown_table(headers, rows))
        print(f"\nmedian saved under the deadline: {100 * statistics.median(saved):.1f}% of the trials' device-hours, "
              f"{100 * statistics.median(pool_saved):.1f}% of the pool's; budget held in {sum(held)} of {len(held)} "
              "seeds")  # fmt: skip
    if args.png:
        _curve(args.png)


def _curve(path: str) -> None:
    """Device-hours against the deadline (as a multiple of the makespan mode's end), seed 0, both clusters."""
    import plotly.graph_objects as go

    from optuna_saturn.report.export import write_png

    figure, floors = go.Figure(), set()
    for name, (trials, cluster) in CASES.items():
        jobs = trials(0)
        end = (simulate(jobs, cluster, Makespan()) or (0.0,))[0]
        points = [(f, simulate(jobs, cluster, Deadline(f * end))) for f in FACTORS]
        xs = [f for f, r in points if r is not None]
        figure.add_trace(
            go.Scatter(x=xs, y=[r[1] for _, r in points if r is not None], mode="lines+markers", name=name)
        )
        floor = round(floor_hours(jobs), 3)
        if floor not in floors:  # (the paper-like trials' floor is the same on both clusters)
            floors.add(floor)
            figure.add_hline(y=floor, line_dash="dot", annotation_text=f"floor: {name.split(',')[0]}")
    figure.update_layout(
        title="Device-hours against the deadline (seed 0)",
        xaxis_title="deadline / makespan mode's end",
        yaxis_title="device-hours the trials held",
        width=900,
        height=500,
    )
    print(f"\ncurve: {path} ({write_png(figure, path, width=900, height=500)})")


if __name__ == "__main__":
    main()
