"""Planning for the pruner against pruning-blind planning, in the simulator that runs the real loop (issue 27).

The paper-like trials (3 model families x 2 batch sizes x 3 learning rates, one 8 x 80 GB node), ``--copies``
times over (a sweep long enough for the pruner's history to say something), arriving one by one as a sampler's
would. A seeded ``--pruned`` share of them (default 0.6) is pruned at a rung: a ninth or a third of their steps
(Hyperband's rungs at a reduction factor of 3), the rest complete. The same trials and the same pruned set run
four ways: pruning-blind (every trial priced at its full length), planning for the pruner (priced at what the
finished trials say it will run; ``optuna_saturn.pricing.survival``), planning to the next rung (that, and a trial
more likely pruned at its next rung than not gets only its most efficient options until it survives it, when it may
grow), and clairvoyant (the true runtimes, pruning included: what no planner can know). "Most any planner gains"
is 1 - LB / blind: no schedule of the trials' real work ends before the lower bound. All re-plan as trials end,
and move running trials that checkpoint (elastic resize, 60 s per move; the clairvoyant arm does not move them).
The study's pruner is Optuna's default median pruner (no prune before 5 trials complete). ``--halving`` prunes as
successive halving at a reduction factor of 3 would instead: two trials in three at each rung.

    python benchmarks/prune_aware.py [--seeds 5] [--copies 3] [--pruned 0.6 | --halving]
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import replace

import _common  # noqa: F401
from workloads import markdown_table, paper_like

from optuna_saturn.planner import Cluster, Job, lower_bound
from optuna_saturn.simulation.simulator import simulate

RUNGS = (1 / 9, 1 / 3)


def pruned_set(names: list[str], share: float, seed: int) -> dict[str, float]:
    """Which trials the pruner stops, and where: ``share`` of them, each at a rung."""
    rng = random.Random(seed)
    stopped = rng.sample(names, round(share * len(names)))
    return {name: rng.choice(RUNGS) for name in stopped}


def halving_set(names: list[str], seed: int) -> dict[str, float]:
    """Which trials successive halving at a reduction factor of 3 stops, and where: two in three at each rung
    (89% pruned in all), drawn with a seed."""
    rng = random.Random(seed)
    stopped = {}
    for name in names:
        rung = next((r for r in RUNGS if rng.random() < 2 / 3), None)
        if rung is not None:
            stopped[name] = rung
    return stopped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--pruned", type=float, default=0.6)
    parser.add_argument("--halving", action="store_true", help="prune as successive halving does (ignores --pruned)")
    args = parser.parse_args()
    base = paper_like()
    jobs = [Job(f"{job.name}-{copy}", job.options) for copy in range(args.copies) for job in base]
    cluster = Cluster([8])
    rows, ratios, rung_ratios = [], [], []
    for seed in range(args.seeds):
        names = [job.name for job in jobs]
        prune_at = halving_set(names, seed) if args.halving else pruned_set(names, args.pruned, seed)
        order = random.Random(seed).sample(jobs, len(jobs))  # (the order a sampler produces them in)
        truth = [
            Job(job.name, [replace(o, runtime=o.runtime * prune_at.get(job.name, 1.0)) for o in job.options])
            for job in order
        ]  # (what each trial really runs: the lower bound's)
        bound = lower_bound(truth, cluster)
        runs = {}
        for arm, kwargs in (
            ("blind", {"plan_for_pruning": False}),
            ("for the pruner", {"plan_for_pruning": True}),
            ("to the next rung", {"plan_for_pruning": True, "plan_to_next_rung": True}),
            ("clairvoyant", {"mode": "clairvoyant", "resize_seconds": None}),
        ):
            options = {"mode": "replan", "resize_seconds": 60.0, "known_ahead": False, "seed": seed, **kwargs}
            runs[arm] = simulate(order, cluster, prune_at=prune_at, **options).makespan
        ratio = runs["for the pruner"] / runs["blind"]
        ratios.append(ratio)
        rung_ratios.append(runs["to the next rung"] / runs["blind"])
        rows.append(
            [
                seed,
                len(prune_at),
                *(runs[a] / 3600 for a in runs),
                ratio,
                rung_ratios[-1],
                runs["blind"] / bound,
                1 - bound / runs["blind"],
            ]
        )
        print(f"seed {seed}: {rows[-1]}", flush=True)
    print()
    how = "two in three pruned at each rung" if args.halving else f"{args.pruned:.0%} pruned at a rung"
    rungs = ", ".join(f"{r:.2f}" for r in RUNGS)
    print(f"{len(jobs)} trials on 8 GPUs, {how} ({rungs} of their steps), {args.seeds} seeds\n")
    print(
        markdown_table(
            [
                "seed",
                "pruned",
                "blind (h)",
                "for the pruner (h)",
                "to the next rung (h)",
                "clairvoyant (h)",
                "for the pruner / blind",
                "to the next rung / blind",
                "blind / LB",
                "most any planner gains",
            ],
            rows,
        )
    )
    for name, values in (("for the pruner", ratios), ("to the next rung", rung_ratios)):
        print(
            f"median ratio, {name} / blind: {statistics.median(values):.3f} (range {min(values):.3f}-{max(values):.3f})"
        )


if __name__ == "__main__":
    main()
