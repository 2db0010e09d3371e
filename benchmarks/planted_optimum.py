"""The planner on multi-node instances whose optimum is known: a planted perfect packing.

Each node's devices x time rectangle (``T`` = 1000 s) is cut at random, in time (at U(0.3, 0.7) of a piece's
length) or in devices (an aligned block in two halves), until the cluster holds the wanted number of pieces; each
piece is a job whose planted option is the piece itself (its devices, its length). Every other option of the job
(1, 2, 4 or 8 devices, each kept with probability 0.7) takes its device-seconds times U(1.05, 1.5): less
efficient. The planted options fill every device until ``T`` and each is its job's most efficient option, so
the area bound is ``T`` and the planted plan reaches it: the optimum is exactly ``T``. Reported: the plan's
makespan over ``T``, for solver "auto" within the time limit.

    python benchmarks/planted_optimum.py [--nodes 8 8 4] [--jobs 100 110 120] [--seeds 3] [--time-limit 10]
"""

from __future__ import annotations

import argparse
import random
import statistics

import _common  # noqa: F401
from workloads import markdown_table

from optuna_saturn.planner import Cluster, Job, Option, lower_bound, solve, validate

HORIZON = 1000.0
STRATEGIES = {1: "single", 2: "ddp", 4: "fsdp", 8: "fsdp"}


def planted(nodes: list[int], n_jobs: int, seed: int) -> list[Job]:
    """Jobs whose optimal makespan on ``Cluster(nodes)`` is ``HORIZON`` (see the module's docstring)."""
    rng = random.Random(seed)
    pieces = [(d, HORIZON) for d in nodes]  # (devices, seconds): each node's rectangle to cut
    while len(pieces) < n_jobs:
        i = rng.randrange(len(pieces))
        devices, seconds = pieces[i]
        if devices > 1 and (seconds < 60 or rng.random() < 0.5):
            pieces[i : i + 1] = [(devices // 2, seconds), (devices // 2, seconds)]
        elif seconds >= 60:
            cut = seconds * rng.uniform(0.3, 0.7)
            pieces[i : i + 1] = [(devices, cut), (devices, seconds - cut)]
    jobs = []
    for k, (devices, seconds) in enumerate(pieces):
        options = [Option(STRATEGIES[devices], devices, seconds)]
        for other in (1, 2, 4, 8):
            if other != devices and other <= max(nodes) and rng.random() < 0.7:
                area = devices * seconds * rng.uniform(1.05, 1.5)
                options.append(Option(STRATEGIES[other], other, area / other))
        jobs.append(Job(f"p{k}", options))
    rng.shuffle(jobs)
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="*", default=[8, 8, 4])
    parser.add_argument("--jobs", type=int, nargs="*", default=[100, 110, 120])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--solver", default="auto")
    args = parser.parse_args()
    cluster = Cluster(args.nodes)
    rows, ratios = [], []
    for n in args.jobs:
        for seed in range(args.seeds):
            jobs = planted(args.nodes, n, seed)
            assert abs(lower_bound(jobs, cluster) - HORIZON) < 1e-6 * HORIZON, lower_bound(jobs, cluster)
            heuristic = solve(jobs, cluster, "list", time_limit=args.time_limit)
            plan = solve(jobs, cluster, args.solver, time_limit=args.time_limit, seed=seed)
            validate(plan, jobs, cluster)
            ratios.append(plan.makespan / HORIZON)
            rows.append(
                [
                    n,
                    seed,
                    heuristic.makespan / HORIZON,
                    plan.makespan / HORIZON,
                    plan.solve_seconds,
                    ",".join(plan.info.get("backends", ["list"])),
                ]
            )
    print(f"nodes {args.nodes}, solver {args.solver}, limit {args.time_limit:g} s; optimum = {HORIZON:g} s\n")
    print(
        markdown_table(
            ["jobs", "seed", "list / optimum", f"{args.solver} / optimum", "solve (s)", "backends run"], rows
        )
    )
    print(f"\nworst {max(ratios):.3f}, median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
