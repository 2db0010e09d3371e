"""Execution under noise, on the real sweep loop (the simulator): static plan vs re-planning vs clairvoyant.

True runtime = estimate x U(0.8, 1.2); each trial is pruned with probability 0.3 at U(0.1, 0.6) of its runtime.
Every trial is enqueued and known at the start. Solver "auto", capped by the loop at 0.1 s per plan (what the
executor does; the virtual clock excludes solver time); the loop wakes once a virtual minute when nothing happens.
"static" keeps every trial where its first plan placed it (the dispatcher still starts it as soon as devices
free); "re-plan" is the executor as it ships, holding running trials for their remaining time at their observed
step rate; "clairvoyant" prices with the true runtimes (prunes included). The "estimated rates" column re-plans
as if running trials kept to their estimates (their progress reports carry no rate).
Usage: ``python benchmarks/simulation.py [--seeds 5]``."""

import argparse
import statistics

import _common  # noqa: F401
from workloads import markdown_table, noisy_outcomes, paper_like, random_workload

from optuna_saturn.planner import Cluster
from optuna_saturn.simulation.simulator import simulate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--work-limit", type=float, default=1.0, help="planner work per plan (planner.WorkLimit units)")
    parser.add_argument("--prune-rate", type=float, default=0.3)
    args = parser.parse_args()
    cases = [
        ("paper-like, 18 trials, [8]", paper_like(), Cluster([8])),
        ("random, 24 trials, [8]", random_workload(24, 100), Cluster([8])),
        ("random, 40 trials, [8, 8]", random_workload(40, 101), Cluster([8, 8])),
    ]
    rows = []
    for name, jobs, cluster in cases:
        out = {m: [] for m in ("static", "replan", "clairvoyant", "replan-estimated")}
        util = {m: [] for m in out}
        for seed in range(args.seeds):
            noise, prunes = noisy_outcomes(jobs, seed, prune_rate=args.prune_rate)
            for mode in out:
                r = simulate(
                    jobs,
                    cluster,
                    noise=noise,
                    prune_at=prunes,
                    mode=mode.split("-")[0],
                    work_limit=args.work_limit,
                    seed=seed,
                    observe_step_rate=mode != "replan-estimated",
                    tick=60.0,
                )
                out[mode].append(r.makespan)
                util[mode].append(r.utilisation)
        s, r, c, e = (statistics.mean(out[m]) for m in ("static", "replan", "clairvoyant", "replan-estimated"))
        recovered = [
            (a - b) / (a - cc) for a, b, cc in zip(out["static"], out["replan"], out["clairvoyant"]) if a - cc > 1e-6
        ]
        rows.append(
            [
                name,
                s / 3600,
                r / 3600,
                c / 3600,
                f"{100 * (s - r) / (s - c):.0f}%" if s > c else "n/a",
                f"{100 * statistics.median(recovered):.0f}%" if recovered else "n/a",
                e / 3600,
                f"{100 * (s - e) / (s - c):.0f}%" if s > c else "n/a",
                statistics.mean(util["static"]),
                statistics.mean(util["replan"]),
                statistics.mean(util["clairvoyant"]),
            ]
        )
    print(f"{args.seeds} seeds, noise +-20%, prune rate {args.prune_rate}, the real loop (plans capped at 0.1 s)\n")
    print(
        markdown_table(
            [
                "workload",
                "static (h)",
                "re-plan (h)",
                "clairvoyant (h)",
                "gap recovered (of means)",
                "gap recovered (median per seed)",
                "re-plan at estimated rates (h)",
                "its gap recovered (of means)",
                "util static",
                "util re-plan",
                "util clairvoyant",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
