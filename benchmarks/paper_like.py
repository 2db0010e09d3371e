"""Paper-like sweep (3 model families x 2 batch sizes x 3 learning rates, one 8 x 80 GB node): every backend
and baseline. Usage: ``python benchmarks/paper_like.py [--time-limit 10]``."""

import argparse

import _common  # noqa: F401
from workloads import markdown_table, paper_like

from optuna_saturn.planner import Cluster, lower_bound, solve, validate

SOLVERS = ["auto", "gurobi", "highs", "cpsat", "list", "greedy", "sequential-max", "task-parallel"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--time-limit", type=float, default=10.0)
    args = parser.parse_args()
    jobs, cluster = paper_like(), Cluster([8])
    lb = lower_bound(jobs, cluster)
    plans = {s: solve(jobs, cluster, s, time_limit=args.time_limit) for s in SOLVERS}
    for p in plans.values():
        validate(p, jobs, cluster)
    seq, tp = plans["sequential-max"].makespan, plans["task-parallel"].makespan
    rows = []
    for s, p in plans.items():
        rows.append([s, p.makespan / 3600, p.makespan / lb, f"{100 * (1 - p.makespan / seq):.1f}%",
                     f"{100 * (1 - p.makespan / tp):.1f}%", f"{100 * (1 - p.makespan / min(seq, tp)):.1f}%",
                     p.solve_seconds])
    print(f"{len(jobs)} trials, {sum(len(j.options) for j in jobs)} options, lower bound {lb / 3600:.3f} h, "
          f"time limit {args.time_limit:g} s\n")
    print(markdown_table(["solver", "makespan (h)", "/ lower bound", "vs sequential-max", "vs task-parallel",
                          "vs better baseline", "solve (s)"], rows))
    print()
    best = plans["auto"]
    print(markdown_table(["trial", "strategy", "devices", "start (h)", "end (h)"],
                         [[a.job, a.option.strategy, ",".join(map(str, a.devices)), a.start / 3600, a.end / 3600]
                          for a in best.assignments]))


if __name__ == "__main__":
    main()
