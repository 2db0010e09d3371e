"""The same sweep through Ray and through SLURM, side by side on this machine: two nodes of two CPU devices each.

The same enqueued trials (the example's GPT-2, ``--n-trials`` of them sampled from ``--seed``; no pruner) run two
ways, each in a fresh process, in alternating rounds (ray, slurm, ray, slurm...: a load on the machine hits both):

- **ray**: a Ray cluster of two nodes of 2 CPUs (``ray.cluster_utils.Cluster``, as the Ray tests start one), in a
  loopback-only network namespace; ``SaturnExecutor(runner="ray", devices=2)``;
- **slurm**: the test cluster (``tests/slurm_cluster.py``: ``slurmctld`` and two ``slurmd`` nodes of 2 CPUs, in
  network namespaces; started once for the run), from outside an allocation:
  ``SaturnExecutor(pool=SlurmPool(nodes=2, partition="debug"), devices=2)`` asks SLURM for the two nodes.

Reported per run: the sweep's wall clock from the executor's construction (the SLURM arm's ``salloc``, the Ray
arm's connection; both pools' hosts and workers starting) to ``optimize``'s return, and the part of it before
the first trial started (the pool's start-up: the allocation, the workers' start, the first plan), the Ray cluster's
own start
(the SLURM cluster's daemons run already, as a site's do), the makespan, and the nodes used; then the ratio
SLURM / Ray of the sweep's wall clock, median and min-max over the pairs of a round. Needs root (namespaces).

    python benchmarks/slurm_vs_ray.py [--rounds 2] [--n-trials 8] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE, os.path.join(ROOT, "examples"), os.path.join(ROOT, "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PER_NODE = 2  # CPU devices of each node (the test cluster's nodes have 2 CPUs)


def run_arm(arm: str, params: list[dict], folder: str) -> dict:
    """One sweep in this process (already in its namespace); its numbers."""
    import optuna
    import vs_optuna

    from optuna_saturn import SaturnExecutor
    from optuna_saturn.pools import SlurmPool

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    began = time.time()
    options: dict = {"pool": SlurmPool(nodes=2, partition="debug", time="30:00")}
    if arm == "ray":
        import ray
        from ray_two_nodes import local_ray_cluster

        cluster = local_ray_cluster(PER_NODE)
        options = {"runner": "ray"}
    study = optuna.create_study(pruner=optuna.pruners.NopPruner())
    for p in params:
        study.enqueue_trial(p)
    started = time.time()
    SaturnExecutor(
        devices=PER_NODE,
        strategies=["single", "ddp"],
        profile_store=os.path.join(folder, f"profiles-{arm}"),
        log_dir=os.path.join(folder, f"runs-{arm}"),
        progress="quiet",
        dashboard=False,
        **options,
    ).optimize(study, vs_optuna.OBJECTIVES["example"], n_trials=len(params))
    wall = time.time() - started
    attrs = [{**t.user_attrs, **t.system_attrs} for t in study.trials if "saturn:actual_runtime" in t.system_attrs]
    if arm == "ray":
        ray.shutdown()
        cluster.shutdown()
    first = min(a["saturn:sweep_started_at"] + a["saturn:actual_start"] for a in attrs)
    return {
        "wall": wall,
        "to_first_trial": first - started,
        "cluster_start": started - began,
        "states": sorted({t.state.name for t in study.trials}),
        "makespan": max(a["saturn:actual_end"] for a in attrs) - min(a["saturn:actual_start"] for a in attrs),
        "nodes": sorted({a.get("saturn:node", {}).get("name", "local") for a in attrs}),
        "options": [f"{a['saturn:strategy']}x{a['saturn:num_devices']}" for a in attrs],
    }


def arm_in_a_process(arm: str, params: list[dict], folder: str, slurm) -> dict:  # type: ignore[no-untyped-def]
    """``run_arm`` in a fresh process: in a loopback-only namespace (Ray), or in the SLURM cluster's controller's."""
    from optuna_saturn.pools.launch_commands import network_isolation_prefix

    argv = [sys.executable, __file__, "--arm", arm, "--folder", folder, "--params", json.dumps(params)]
    command = [*network_isolation_prefix(), *argv] if arm == "ray" else slurm.command(*argv)
    out = subprocess.run(command, capture_output=True, text=True, check=False, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{arm} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2, help="rounds of one run of each arm (ray, then slurm)")
    parser.add_argument("--n-trials", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--params", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(run_arm(args.arm, json.loads(args.params), args.folder)))
        return
    if os.geteuid() != 0:
        parser.error("run it as root: the SLURM test cluster and the Ray cluster's namespace need it")
    import gpt2_sweep
    import slurm_cluster
    import vs_optuna
    from workloads import markdown_table

    gpt2_sweep.token_ids()  # the example's data, built once before any arm is timed
    params = vs_optuna.trial_params("example", args.n_trials, args.seed)
    slurm_folder = tempfile.mkdtemp(prefix="saturn-slurm-")  # (short: munge's socket path)
    rows, walls = [], {"ray": [], "slurm": []}
    try:
        slurm = slurm_cluster.start(slurm_folder)
        with tempfile.TemporaryDirectory() as folder:
            for round_ in range(args.rounds):
                for arm in ("ray", "slurm"):
                    r = arm_in_a_process(arm, params, folder, slurm)
                    print(f"round {round_ + 1} {arm}: {json.dumps(r)}", file=sys.stderr, flush=True)
                    walls[arm].append(r["wall"])
                    rows.append(
                        [
                            round_ + 1,
                            arm,
                            f"{r['wall']:.1f}",
                            f"{r['to_first_trial']:.1f}",
                            f"{r['cluster_start']:.1f}",
                            f"{r['makespan']:.1f}",
                            ", ".join(r["states"]),
                            ", ".join(r["nodes"]),
                            " ".join(r["options"]),
                        ]
                    )
    finally:
        slurm_cluster.stop(slurm_folder)
        shutil.rmtree(slurm_folder, ignore_errors=True)
    headers = ["round", "arm", "sweep wall (s)", "to 1st trial (s)", "cluster start (s)", "makespan (s)", "states"]
    headers += ["nodes", "options"]
    print(markdown_table(headers, rows))
    ratios = [s / r for s, r in zip(walls["slurm"], walls["ray"])]
    print(
        f"\nSLURM / Ray, sweep wall clock: median {statistics.median(ratios):.2f} "
        f"(min-max {min(ratios):.2f}-{max(ratios):.2f}) over {len(ratios)} rounds"
    )


if __name__ == "__main__":
    main()
