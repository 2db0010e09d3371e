"""Elastic resize on the real sweep loop (the simulator): re-planning that may also move running trials, against
plain re-planning.

The same noisy, partly pruned executions as ``benchmarks/simulation.py`` (true runtime = estimate x U(0.8, 1.2);
each trial pruned with probability 0.3 at U(0.1, 0.6) of its steps; prunes are not foreseen). Both arms re-plan
at every trial end with running trials held for their remaining time at their observed step rate; in the resize
arm the loop's elastic policy may also stop one running trial at its next checkpoint (every tenth of its steps)
and go on under another option from there, after a restart cost (``optuna_saturn.planner.best_resize``: only
when the plan with the move, its cost included, is shorter by more than 2% and than twice the move's cost).
Restart costs: the paper-like trials' from the cost model (``workloads.py``: checkpoint written and read, a new process
group, the model load: 21-112 s); the random trials' (10 min to 3 h on one
device) a fixed 60, 300 or 900 s. Solver "list" for both arms (what the executor runs while devices wait).
Reported: mean makespan of each arm, the mean and worst per-seed ratio resize / re-plan, seeds won and lost, and
moves per sweep.

    python benchmarks/elastic_resize.py [--seeds 20]
"""

import argparse
import statistics

import _common  # noqa: F401
from workloads import markdown_table, noisy_outcomes, paper_like, paper_like_restart_seconds, random_workload

from optuna_saturn.planner import Cluster
from optuna_saturn.simulation.simulator import simulate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--prune-rate", type=float, default=0.3)
    args = parser.parse_args()
    cases = [("paper-like, 18 trials, [8]", paper_like(), Cluster([8]), paper_like_restart_seconds(), "model")]
    for cost in (60.0, 300.0, 900.0):
        cases += [
            ("random, 24 trials, [8]", random_workload(24, 100), Cluster([8]), cost, f"{cost:.0f} s"),
            ("random, 40 trials, [8, 8]", random_workload(40, 101), Cluster([8, 8]), cost, f"{cost:.0f} s"),
            ("random, 12 trials, [4]", random_workload(12, 102, max_devices=4), Cluster([4]), cost, f"{cost:.0f} s"),
        ]
    rows = []
    for name, jobs, cluster, cost, cost_label in cases:
        plain, moved, ratios, moves = [], [], [], []
        for seed in range(args.seeds):
            noise, prunes = noisy_outcomes(jobs, seed, prune_rate=args.prune_rate)
            common = dict(noise=noise, prune_at=prunes, mode="replan", solver="list", seed=seed, tick=60.0)
            a = simulate(jobs, cluster, **common)
            b = simulate(jobs, cluster, resize_seconds=cost, **common)
            plain.append(a.makespan)
            moved.append(b.makespan)
            ratios.append(b.makespan / a.makespan)
            moves.append(b.info["resizes"])
        rows.append(
            [
                name,
                cost_label,
                statistics.mean(plain) / 3600,
                statistics.mean(moved) / 3600,
                f"{statistics.mean(ratios):.3f}",
                f"{max(ratios):.3f}",
                sum(r < 1 - 1e-9 for r in ratios),
                sum(r > 1 + 1e-9 for r in ratios),
                f"{statistics.mean(moves):.1f}",
            ]
        )
    print(f"{args.seeds} seeds, noise +-20%, prune rate {args.prune_rate}, solver list\n")
    print(
        markdown_table(
            [
                "workload",
                "restart cost",
                "re-plan (h)",
                "re-plan + resize (h)",
                "resize / re-plan (mean)",
                "worst seed",
                "seeds won",
                "seeds lost",
                "moves per sweep",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
