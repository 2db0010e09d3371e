"""Scaling: solve time and gap to the lower bound for 10-1000 trials on 8-64 devices (solver "auto").
Usage: ``python benchmarks/scaling.py [--seed 0]``. Time limits: 10 s up to 50 trials, 30 s for 200, 60 s for 1000."""

import argparse

import _common  # noqa: F401
from workloads import markdown_table, random_workload

from optuna_saturn.planner import Cluster, lower_bound, solve, validate

LIMITS = {10: 10.0, 50: 10.0, 200: 30.0, 1000: 60.0}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sizes", type=int, nargs="*", default=list(LIMITS))
    parser.add_argument("--nodes", type=int, nargs="*", default=[1, 4, 8])
    args = parser.parse_args()
    rows = []
    for n in args.sizes:
        for k in args.nodes:
            cluster = Cluster([8] * k)
            jobs = random_workload(n, args.seed)
            lb = lower_bound(jobs, cluster)
            heuristic = solve(jobs, cluster, "list", time_limit=LIMITS[n])
            plan = solve(jobs, cluster, "auto", time_limit=LIMITS[n], seed=args.seed)
            validate(plan, jobs, cluster)
            rows.append(
                [
                    n,
                    8 * k,
                    LIMITS[n],
                    heuristic.makespan / lb,
                    heuristic.solve_seconds,
                    plan.makespan / lb,
                    plan.solve_seconds,
                    ",".join(plan.info.get("backends", ["list"])),
                ]
            )
    print(
        markdown_table(
            ["trials", "devices", "limit (s)", "list / LB", "list (s)", "auto / LB", "auto (s)", "backends run"], rows
        )
    )


if __name__ == "__main__":
    main()
