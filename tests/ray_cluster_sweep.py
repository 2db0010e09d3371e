"""A real sweep with ``runner="ray"`` on a Ray cluster of two nodes started on this machine
(``ray.cluster_utils.Cluster``), for ``tests/test_ray_runner.py``. Run it inside a loopback-only network namespace:
``python tests/ray_cluster_sweep.py MODE OUT.json`` with MODE ``spread`` (two nodes of two CPU devices, DDP and
single trials, the study in a PostgreSQL server started in the same namespace), ``node-death`` (two nodes of one
device; the worker node is removed while a trial runs there), ``node-joins`` (one node of one device; a second
joins once the first trial runs), ``two-sweeps`` (one node of one device, two sweeps of two studies at once:
Ray's resources, not optuna-saturn's leases, give the device to one at a time) or ``release`` (two nodes of one
device, a deadline: the node no trial left needs goes back to the cluster before the sweep ends). Writes what the
test checks as JSON."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import objectives  # noqa: E402
import optuna  # noqa: E402
import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from optuna_saturn import SaturnExecutor  # noqa: E402
from optuna_saturn.events import SweepListener, TrialStart  # noqa: E402


class AddNodeOnceATrialRuns(SweepListener):
    """Once the first trial runs, a node joins the cluster the way a user adds one: ``ray start --address``."""

    def __init__(self, address: str) -> None:
        self._address = address
        self.process: subprocess.Popen | None = None
        self.added_at: float | None = None

    def on_trial_start(self, study: optuna.Study, start: TrialStart) -> None:
        if self.process is None:
            ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
            self.process = subprocess.Popen(
                [
                    ray_bin,
                    "start",
                    f"--address={self._address}",
                    "--node-ip-address=127.0.0.1",
                    "--num-cpus=1",
                    "--disable-usage-stats",
                    "--block",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            self.added_at = time.time()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)


class WatchPlacementGroups(SweepListener):
    """At each trial's end: the states of the sweep's placement groups (one per node) in Ray's table."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def on_trial_end(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, now: float) -> None:
        from ray.util import placement_group_table

        groups = placement_group_table().values()
        self.seen.append(sorted(g["state"] for g in groups if g["name"].startswith("optuna-saturn-")))


class KillNodeWhenATrialRunsThere(SweepListener):
    """Kills a Ray worker node (``kill()``: its raylet, or all of it) once the first trial there has saved a
    checkpoint (observed in the study, not timed), so that its run again must resume from the shared folder."""

    def __init__(self, node_name: str, kill, storage: str) -> None:
        self._node_name, self._kill, self._storage = node_name, kill, storage
        self.removed_at: float | None = None
        self.victim: int | None = None

    def on_trial_start(self, study: optuna.Study, start: TrialStart) -> None:
        if self.victim is None and any(d.startswith(self._node_name + "/") for d in start.devices):
            self.victim = start.number
            threading.Thread(target=self._remove_once_checkpointed, args=(study.study_name,), daemon=True).start()

    def _remove_once_checkpointed(self, name: str) -> None:
        study = optuna.load_study(study_name=name, storage=self._storage)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if "saturn:checkpoint" in study.trials[self.victim].system_attrs:
                break
            time.sleep(0.1)
        self._kill()
        self.removed_at = time.time()


def main(
    mode: str, out: str, address: str | None = None, raylet_pid: int | None = None, worker_ip: str | None = None
) -> None:
    """``address``: a cluster started outside (the network-namespace hosts), whose worker node is at
    ``worker_ip`` and has its raylet at ``raylet_pid``; None: a ``Cluster`` started here. Whatever it starts is
    stopped, also when it fails."""
    with contextlib.ExitStack() as stack:
        if mode == "two-sweeps":
            _two_sweeps(out, stack)
        else:
            _sweep(mode, out, stack, address, raylet_pid, worker_ip)


def _two_sweeps(out: str, stack: contextlib.ExitStack) -> None:
    """Two executors in two threads of one driver, on two studies, on a one-device cluster, at once."""
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False}
    )
    stack.callback(cluster.shutdown)
    ray.init(address=cluster.address, log_to_driver=False, runtime_env={"env_vars": {"SATURN_TEST_SLEEPY_STEPS": "20"}})
    stack.callback(ray.shutdown)
    tmp = tempfile.mkdtemp(prefix="saturn-ray-test-")
    storage = f"sqlite:///{tmp}/studies.db"
    errors: list[str] = []

    def sweep(name: str) -> None:
        try:
            study = optuna.create_study(storage=storage, study_name=name, load_if_exists=True)
            executor = SaturnExecutor(
                devices=1, strategies=["single"], runner="ray", log_dir=f"{tmp}/{name}", progress="plain",
                dashboard=False, profile_store=f"{tmp}/profiles-{name}",
            )  # fmt: skip
            executor.optimize(study, objectives.sleepy, n_trials=2)
        except BaseException as exc:  # (reported in the JSON: the test says what went wrong)
            errors.append(f"{name}: {exc!r}")

    optuna.storages.RDBStorage(storage)  # (the tables, once)
    threads = [threading.Thread(target=sweep, args=(name,)) for name in ("first", "second")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    runs = [
        {
            "study": name,
            "state": t.state.name,
            "node": (t.user_attrs.get("saturn:node") or {}).get("node_id"),
            # (when it ran on the device: a trial is asked, and RUNNING in the study, before its device frees)
            "start": t.system_attrs["saturn:sweep_started_at"] + t.system_attrs["saturn:actual_start"],
            "end": t.system_attrs["saturn:sweep_started_at"] + t.system_attrs["saturn:actual_end"],
        }
        for name in ("first", "second")
        for t in optuna.load_study(study_name=name, storage=storage).trials
    ]
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"errors": errors, "runs": runs}, f)


def _sweep(
    mode: str, out: str, stack: contextlib.ExitStack, address: str | None, raylet_pid: int | None, worker_ip: str | None
) -> None:
    started = time.time()
    per_node = 2 if mode == "spread" else 1
    # spread: 6 s trials, so that both nodes' workers are up before the trials are all done
    env = {
        "SATURN_TEST_SLEEPY_STEPS": "30",  # (node-joins, release: 3 s a trial)
        "SATURN_TEST_EPOCH_SLEEP": "0.4",
        "HF_HUB_OFFLINE": "1",
        "SATURN_TEST_STEP_SLEEP": "0.25",
        "SATURN_TEST_CHECKPOINT_EVERY": "4",
        "SATURN_TEST_EPOCHS": "4",
    }  # (node-death: 4 s trials of 16 steps, the node killed once the first checkpoint, at step 4, is in the study)
    # the trials' environment reaches the actors through Ray (they are not the driver's children)
    if address is None:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": per_node, "node_ip_address": "127.0.0.1", "include_dashboard": False},
        )
        stack.callback(cluster.shutdown)
        worker = None if mode == "node-joins" else cluster.add_node(num_cpus=per_node, node_ip_address="127.0.0.1")
        address = cluster.address
        ray.init(address=address, log_to_driver=False, runtime_env={"env_vars": env})
        stack.callback(ray.shutdown)
        cluster.wait_for_nodes()
        worker_id = None if worker is None else worker.node_id
        kill = lambda: cluster.remove_node(worker, allow_graceful=False)  # noqa: E731
    else:
        ray.init(address=address, log_to_driver=False, runtime_env={"env_vars": env})
        stack.callback(ray.shutdown)
        alive = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == worker_ip]
        if not alive:
            sys.exit(f"the worker host's node ({worker_ip}) is not alive (its raylet is killed only in node-death)")
        worker_id = alive[0]
        kill = lambda: os.kill(raylet_pid, signal.SIGKILL)  # noqa: E731
    tmp = tempfile.mkdtemp(prefix="saturn-ray-test-")
    if mode == "spread":
        from postgres import PostgresServer

        server = PostgresServer()
        stack.callback(server.remove)
        server.start()
        storage = server.create_database("ray_sweep")
    else:
        storage = f"sqlite:///{tmp}/study.db"
    study = optuna.create_study(storage=storage, study_name=mode)
    listeners: list[SweepListener] = []
    names = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    if mode == "node-death":
        victim = KillNodeWhenATrialRunsThere(_node_name(worker_id, names), kill, storage)
        listeners.append(victim)
    if mode == "release":
        watch = WatchPlacementGroups()
        listeners.append(watch)
    if mode == "node-joins":
        known = set(names)
        joiner = AddNodeOnceATrialRuns(address)
        stack.callback(joiner.stop)
        listeners.append(joiner)
    executor = SaturnExecutor(
        devices=per_node,
        strategies=["single", "ddp"] if mode == "spread" else ["single"],
        runner="ray",
        log_dir=f"{tmp}/runs",
        profile_store=f"{tmp}/profiles",
        progress="plain",
        dashboard=False,
        listeners=listeners,
        max_retries=1,
        checkpoint_dir=f"{tmp}/checkpoints",  # (every node sees it)
        deadline="1h" if mode == "release" else None,
    )
    objective = {"spread": objectives.train_linear, "node-death": objectives.resumable}.get(mode, objectives.sleepy)
    executor.optimize(study, objective, n_trials={"spread": 6, "node-death": 3, "node-joins": 8, "release": 3}[mode])
    result = {
        "seconds": time.time() - started,
        "driver_pid": os.getpid(),
        "storage": storage,
        "devices": [str(d) for d in executor.devices],
        "worker_node": worker_id,
        "trials": [
            {
                "number": t.number,
                "state": t.state.name,
                "value": t.value,
                "attrs": {
                    k: v for k, v in {**t.user_attrs, **t.system_attrs}.items() if not k.startswith("saturn:profil")
                },
                "log": Path(t.system_attrs["saturn:log"]).read_text(encoding="utf-8")
                if os.path.exists(t.system_attrs.get("saturn:log", ""))
                else None,
            }
            for t in study.trials
        ],
    }
    if mode == "node-death":
        result["victim"], result["removed_at"] = victim.victim, victim.removed_at
    if mode == "release":
        result["groups_seen"], result["summary"] = watch.seen, study.user_attrs["saturn:last_sweep"]
    if mode == "node-joins":
        result["joined_node"] = next((n["NodeID"] for n in ray.nodes() if n["NodeID"] not in known), None)
        result["added_at"] = joiner.added_at
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, default=str)


def _node_name(node_id: str, ips: dict[str, str]) -> str:
    """The executor's name for a node (``optuna_saturn.pools.ray_cluster``): its IP, and its id where IPs repeat."""
    ip = ips[node_id]
    return ip if list(ips.values()).count(ip) == 1 else f"{ip}#{node_id[:6]}"


if __name__ == "__main__":
    extra = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    main(sys.argv[1], sys.argv[2], **extra)
