"""Seeded random workloads: makespan / lower bound per backend, averaged over seeds.
Usage: ``python benchmarks/random_workloads.py [--seeds 5] [--time-limit 5]``."""

import argparse
import statistics

import _common  # noqa: F401
from workloads import markdown_table, random_workload

from optuna_saturn.planner import Cluster, lower_bound, solve, validate

SOLVERS = ["auto", "gurobi", "highs", "cpsat", "list", "greedy", "sequential-max", "task-parallel"]
CASES = [(16, [8]), (32, [8]), (48, [8, 8])]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--time-limit", type=float, default=5.0)
    args = parser.parse_args()
    rows = []
    for n, nodes in CASES:
        cluster = Cluster(nodes)
        ratios = {s: [] for s in SOLVERS}
        times = {s: [] for s in SOLVERS}
        for seed in range(args.seeds):
            jobs = random_workload(n, seed)
            lb = lower_bound(jobs, cluster)
            for s in SOLVERS:
                p = solve(jobs, cluster, s, time_limit=args.time_limit, seed=seed)
                validate(p, jobs, cluster)
                ratios[s].append(p.makespan / lb)
                times[s].append(p.solve_seconds)
        for s in SOLVERS:
            rows.append([f"{n} on {nodes}", s, statistics.mean(ratios[s]), max(ratios[s]), statistics.mean(times[s])])
    print(f"{args.seeds} seeds per case, time limit {args.time_limit:g} s\n")
    print(markdown_table(["instance", "solver", "mean makespan / LB", "worst / LB", "mean solve (s)"], rows))


if __name__ == "__main__":
    main()
