"""A sweep on a two-node Ray cluster against the same sweep on one local node of the same total size, in one run.

The same enqueued trials (the example's GPT-2 by default; no pruner) run two ways, each in a fresh process:

- **local**: ``SaturnExecutor(devices=N)`` on this machine's N CPU devices;
- **ray**: ``SaturnExecutor(runner="ray", devices=N // 2)`` on a Ray cluster of two nodes of N // 2 CPUs each,
  started on this machine (``ray.cluster_utils.Cluster``), trials inside one node each.

Reported per arm: the wall clock (Ray's start-up included), the makespan and its ratio to the lower bound of the
trials' actual runtimes on the devices they used (what no plan could beat), the nodes the trials ran on, and the
options. The target: ray's makespan / LB no worse than local's. Everything runs inside a loopback-only network
namespace (the script re-runs itself in one), so Ray listens nowhere else.

    python benchmarks/ray_two_nodes.py [--objective example|wide] [--n-trials 8] [--devices 2] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE, os.path.join(ROOT, "examples")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_ISOLATED = "SATURN_BENCH_ISOLATED"


def local_ray_cluster(per_node: int) -> Any:
    """Two Ray nodes of ``per_node`` CPUs each on this machine's loopback, this process connected as the driver
    (``ray.cluster_utils.Cluster``): the cluster every Ray arm of the benchmarks runs on."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": per_node, "node_ip_address": "127.0.0.1", "include_dashboard": False},
    )
    cluster.add_node(num_cpus=per_node, node_ip_address="127.0.0.1")
    ray.init(address=cluster.address, log_to_driver=False, runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1"}})
    cluster.wait_for_nodes()
    return cluster


def run_arm(arm: str, objective: str, params: list[dict], devices: int, folder: str) -> dict:
    import optuna
    import vs_optuna

    from optuna_saturn import SaturnExecutor

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cluster = None
    options: dict = {}
    started = time.time()
    if arm == "ray":
        import ray

        per_node = devices // 2
        cluster = local_ray_cluster(per_node)
        options = {"runner": "ray"}
        devices = per_node
    study = optuna.create_study(pruner=optuna.pruners.NopPruner())
    for p in params:
        study.enqueue_trial(p)
    SaturnExecutor(
        devices=devices,
        strategies=["single", "ddp"],
        profile_store=os.path.join(folder, f"profiles-{arm}"),
        log_dir=os.path.join(folder, f"runs-{arm}"),
        progress="quiet",
        dashboard=False,
        **options,
    ).optimize(study, vs_optuna.OBJECTIVES[objective], n_trials=len(params))
    wall = time.time() - started
    attrs = [{**t.user_attrs, **t.system_attrs} for t in study.trials if "saturn:actual_runtime" in t.system_attrs]
    runtimes = [a["saturn:actual_runtime"] for a in attrs]
    used = [a["saturn:num_devices"] for a in attrs]
    total = len(attrs[0]["saturn:pool"]) if attrs else devices
    makespan = max(a["saturn:actual_end"] for a in attrs) - min(a["saturn:actual_start"] for a in attrs)
    if cluster is not None:
        import ray

        ray.shutdown()
        cluster.shutdown()
    return {
        "wall": wall,
        "states": sorted({t.state.name for t in study.trials}),
        "makespan": makespan,
        "lower_bound": vs_optuna._lower_bound(runtimes, used, total),
        "nodes": sorted({a.get("saturn:node", {}).get("name", "local") for a in attrs}),
        "options": [f"{a['saturn:strategy']}x{a['saturn:num_devices']}" for a in attrs],
    }


def _arm_in_a_process(arm: str, objective: str, params: list[dict], devices: int, folder: str) -> dict:
    from workloads import arm_in_a_process

    return arm_in_a_process(
        __file__,
        "--arm",
        arm,
        "--objective",
        objective,
        "--devices",
        str(devices),
        "--folder",
        folder,
        "--params",
        json.dumps(params),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--objective", default="example", choices=["example", "wide"])
    parser.add_argument("--n-trials", type=int, default=8)
    parser.add_argument("--devices", type=int, default=2, help="in all: the Ray arm has two nodes of half as many")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--params", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(run_arm(args.arm, args.objective, json.loads(args.params), args.devices, args.folder)))
        return
    if args.devices < 2 or args.devices % 2:
        parser.error("--devices must be even: two nodes of half as many")
    if not os.environ.get(_ISOLATED):  # Ray's processes listen on every interface: only loopback here
        from optuna_saturn.pools.launch_commands import network_isolation_prefix

        os.environ[_ISOLATED] = "1"
        os.execvp("unshare", [*network_isolation_prefix(), sys.executable, *sys.argv])

    import gpt2_sweep
    import vs_optuna
    from workloads import markdown_table

    gpt2_sweep.token_ids()  # the example's data, built once before any arm is timed
    rows = []
    for repeat in range(args.repeats):
        params = vs_optuna.trial_params(args.objective, args.n_trials, args.seed + repeat)
        results = {}
        with tempfile.TemporaryDirectory() as folder:
            for arm in ("local", "ray"):
                results[arm] = _arm_in_a_process(arm, args.objective, params, args.devices, folder)
                print(f"seed {args.seed + repeat} {arm}: {json.dumps(results[arm])}", file=sys.stderr, flush=True)
        local_ratio = results["local"]["makespan"] / results["local"]["lower_bound"]
        for arm, r in results.items():
            ratio = r["makespan"] / r["lower_bound"]
            rows.append(
                [
                    args.seed + repeat,
                    arm,
                    f"{r['wall']:.1f}",
                    f"{r['makespan']:.1f}",
                    f"{r['lower_bound']:.1f}",
                    f"{ratio:.2f}",
                    f"{ratio / local_ratio:.2f}",
                    ", ".join(r["nodes"]),
                    " ".join(r["options"]),
                ]
            )
    print(
        markdown_table(
            [
                "seed",
                "arm",
                "wall (s)",
                "makespan (s)",
                "lower bound (s)",
                "makespan / LB",
                "÷ local's",
                "nodes",
                "options",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
