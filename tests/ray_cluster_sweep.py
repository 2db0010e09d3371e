"""A real sweep with ``runner="ray"`` on a Ray cluster of two nodes started on this machine
(``ray.cluster_utils.Cluster``), for ``tests/test_ray_runner.py``. Run it inside a loopback-only network namespace:
``python tests/ray_cluster_sweep.py MODE OUT.json`` with MODE ``spread`` (two nodes of two CPU devices, DDP and
single trials, the study in a PostgreSQL server started in the same namespace) or ``node-death`` (two nodes of one
device; the worker node is removed while a trial runs there). Writes what the test checks as JSON."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import optuna  # noqa: E402
import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import objectives  # noqa: E402
from optuna_saturn import SaturnExecutor  # noqa: E402
from optuna_saturn.events import SweepListener, TrialStart  # noqa: E402


class RemoveNodeWhenATrialRunsThere(SweepListener):
    """Removes the Ray worker node (its raylet and everything on it) a few seconds into the first trial there."""

    def __init__(self, cluster: Cluster, node, node_id: str, after: float) -> None:
        self._cluster, self._node, self._node_id, self._after = cluster, node, node_id, after
        self.removed_at: float | None = None
        self.victim: int | None = None

    def on_trial_start(self, study: optuna.Study, start: TrialStart) -> None:
        if self.victim is None and any(self._node_id[:6] in d for d in start.devices):
            self.victim = start.number
            threading.Timer(self._after, self._remove).start()

    def _remove(self) -> None:
        self._cluster.remove_node(self._node, allow_graceful=False)
        self.removed_at = time.time()


def main(mode: str, out: str) -> None:
    started = time.time()
    per_node = 2 if mode == "spread" else 1
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": per_node, "node_ip_address": "127.0.0.1", "include_dashboard": False})
    worker = cluster.add_node(num_cpus=per_node, node_ip_address="127.0.0.1")
    # the trials' environment reaches the actors through Ray (they are not the driver's children)
    ray.init(address=cluster.address, log_to_driver=False,
             runtime_env={"env_vars": {"SATURN_TEST_SLEEPY_STEPS": "100", "HF_HUB_OFFLINE": "1"}})  # 10 s a trial
    cluster.wait_for_nodes()
    tmp = tempfile.mkdtemp(prefix="saturn-ray-test-")
    server = None
    if mode == "spread":
        from postgres import PostgresServer

        server = PostgresServer()
        server.start()
        storage = server.create_database("ray_sweep")
    else:
        storage = f"sqlite:///{tmp}/study.db"
    study = optuna.create_study(storage=storage, study_name=mode)
    listeners = []
    if mode == "node-death":
        victim = RemoveNodeWhenATrialRunsThere(cluster, worker, worker.node_id, after=3.0)
        listeners.append(victim)
    executor = SaturnExecutor(
        devices=per_node, strategies=["single", "ddp"] if mode == "spread" else ["single"], runner="ray",
        log_dir=f"{tmp}/runs", profile_store=f"{tmp}/profiles", progress="plain", dashboard=False,
        listeners=listeners, max_retries=1,
    )
    objective = objectives.train_linear if mode == "spread" else objectives.sleepy
    executor.optimize(study, objective, n_trials=6 if mode == "spread" else 3)
    result = {
        "seconds": time.time() - started, "driver_pid": os.getpid(), "storage": storage,
        "devices": [str(d) for d in executor.devices],
        "worker_node": worker.node_id,
        "trials": [{
            "number": t.number, "state": t.state.name, "value": t.value,
            "attrs": {k: v for k, v in t.user_attrs.items() if not k.startswith("saturn:profil")},
            "log": open(t.user_attrs["saturn:log"], encoding="utf-8").read()
            if os.path.exists(t.user_attrs.get("saturn:log", "")) else None,
        } for t in study.trials],
    }
    if mode == "node-death":
        result["victim"], result["removed_at"] = victim.victim, victim.removed_at
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, default=str)
    ray.shutdown()
    cluster.shutdown()
    if server is not None:
        server.remove()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
