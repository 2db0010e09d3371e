"""Paper-like sweep (3 model families x 2 batch sizes x 3 learning rates, one 8 x 80 GB node): every backend
and baseline, then optuna-saturn net of its start-up and profiling costs against the baselines, which launch every
trial, and the same sweep run by the real loop in the simulator (warm workers' start, a process group per trial;
warm: every option measured; cold: every option predicted off by up to 30%, and the value-of-information rule
measuring on idle devices, as the executor does). Usage: ``python benchmarks/paper_like.py [--work 10]``.

Every plan is made with a work limit (``--work`` units of :class:`optuna_saturn.planner.WorkLimit`, about a second
each on the development machine), not a time limit, so the tables are the same on every run and machine. The
solvers' wall seconds are printed after the first table, outside it."""

import argparse

import _common  # noqa: F401
from workloads import (
    POOL_START_SECONDS,
    WARM_JOB_SECONDS,
    markdown_table,
    paper_like,
    paper_like_profiling_seconds,
    paper_like_simulated,
    paper_like_voi_profiling,
)

from optuna_saturn.events import SweepListener
from optuna_saturn.planner import Cluster, WorkLimit, lower_bound, solve, validate
from optuna_saturn.simulation.simulator import run_simulation

SOLVERS = ["auto", "gurobi", "highs", "cpsat", "list", "greedy", "sequential-max", "task-parallel"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=float, default=10.0, help="units of work per plan (WorkLimit)")
    args = parser.parse_args()
    jobs, cluster = paper_like(), Cluster([8])
    lb = lower_bound(jobs, cluster)
    work = WorkLimit(args.work)
    plans = {s: solve(jobs, cluster, s, work_limit=work) for s in SOLVERS}
    for p in plans.values():
        validate(p, jobs, cluster)
    seq, tp = plans["sequential-max"].makespan, plans["task-parallel"].makespan
    rows = []
    for s, p in plans.items():
        rows.append(
            [
                s,
                p.makespan / 3600,
                p.makespan / lb,
                f"{100 * (1 - p.makespan / seq):.1f}%",
                f"{100 * (1 - p.makespan / tp):.1f}%",
                f"{100 * (1 - p.makespan / min(seq, tp)):.1f}%",
            ]
        )
    print(
        f"{len(jobs)} trials, {sum(len(j.options) for j in jobs)} options, lower bound {lb / 3600:.3f} h, "
        f"work limit {args.work:g} units\n"
    )
    print(
        markdown_table(
            ["solver", "makespan (h)", "/ lower bound", "vs sequential-max", "vs task-parallel", "vs better baseline"],
            rows,
        )
    )
    walls = ", ".join(f"{s} {p.solve_seconds:.2f}" for s, p in plans.items())
    print(f"\n(wall seconds this run took to solve, which vary from run to run: {walls})\n")
    net_rows = net_of_costs(lb, seq, tp, work)
    print(markdown_table(["optuna-saturn, net of", "makespan (h)", "vs better baseline"], net_rows))
    print()
    print(
        markdown_table(
            ["the real loop, simulated", "makespan (h)", "/ lower bound", "vs better baseline", "profiling jobs"],
            on_the_real_loop(lb, min(seq, tp)),
        )
    )
    print()
    best = plans["auto"]
    print(
        markdown_table(
            ["trial", "strategy", "devices", "start (h)", "end (h)"],
            [
                [a.job, a.option.strategy, ",".join(map(str, a.devices)), a.start / 3600, a.end / 3600]
                for a in best.assignments
            ],
        )
    )


def net_of_costs(lb: float, seq: float, tp: float, work: WorkLimit) -> list[list[object]]:
    """optuna-saturn's makespan when the costs the planner's runtimes leave out are counted: its warm workers
    start once per sweep and each trial then pays a process group instead of a launch; profiling takes device
    time (at most every option of every distinct workload measured once, spread over the pool's devices)."""
    cluster = Cluster([8])
    warm_jobs = paper_like(startup=WARM_JOB_SECONDS)
    warm = solve(warm_jobs, cluster, "auto", work_limit=work)
    validate(warm, warm_jobs, cluster)
    everything = paper_like_profiling_seconds() / cluster.total_devices
    voi_seconds, measured, candidates = paper_like_voi_profiling()
    better = min(seq, tp)
    rows = []
    for label, makespan in (
        ("nothing (the plan above)", solve(paper_like(), cluster, "auto", work_limit=work).makespan),
        ("warm workers: pool start-up, a process group per trial", warm.makespan + POOL_START_SECONDS),
        (
            f"... and the options the value-of-information rule measures ({measured} of {candidates}, predictions "
            "off by up to 30%)",
            warm.makespan + POOL_START_SECONDS + voi_seconds / cluster.total_devices,
        ),
        (
            f"... and all {candidates} options of every distinct workload measured (worst case)",
            warm.makespan + POOL_START_SECONDS + everything,
        ),
    ):
        rows.append([label, makespan / 3600, f"{100 * (1 - makespan / better):.1f}%"])
    return rows


def on_the_real_loop(lb: float, better: float) -> list[list[object]]:
    """The sweep as the executor runs it: the simulator's real loop, from the pool's start (its workers take
    ``POOL_START_SECONDS``), every trial enqueued at once, the loop's idle wake-ups once a virtual minute."""
    rows = []
    for label, cold in (
        ("warm store: every option measured", False),
        ("cold store: options predicted off by up to 30%, measured where it pays", True),
    ):
        jobs = paper_like_simulated(cold=cold)
        profiles = []
        listener = _ProfileCount(profiles)
        result = run_simulation(
            jobs, Cluster([8]), solver="auto", workers_ready=POOL_START_SECONDS, tick=60.0, listeners=[listener]
        )
        wall = result.info["wall_seconds"]
        rows.append([label, wall / 3600, wall / lb, f"{100 * (1 - wall / better):.1f}%", len(profiles)])
    return rows


class _ProfileCount(SweepListener):
    def __init__(self, started: list) -> None:
        self._started = started

    def on_profile(self, study, event) -> None:
        if event.phase == "started":
            self._started.append(event)


if __name__ == "__main__":
    main()
