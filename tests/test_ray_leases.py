"""A Ray sweep leases its devices on its nodes, as a local sweep does on its machine: a Ray sweep and a local sweep
on one machine take turns (reliability review: both ran on the same cores at once, as on GPUs they would share a
GPU). Each device's actor takes its lease before it starts for real; while another sweep holds it, its ``ready``
answers who does, and the pool says so and waits.

Run as a script, this file runs the sweeps of the launch test: ``python tests/test_ray_leases.py both WORK``
(inside a loopback-only network namespace) starts a Ray sweep, then, once its workers are up, a local sweep with
the same lease folder, and writes what the test checks to ``WORK/result.json``."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from optuna_saturn import leases
from optuna_saturn.devices import Device
from optuna_saturn.leases import DeviceLeases, current_leases
from optuna_saturn.pools.ray_actor import DeviceActor
from optuna_saturn.pools.ray_lease import ActorLease, actor_lease_names

TRIAL_SECONDS = 2.0


# -- the actor's lease -------------------------------------------------------------------------------------------------
@pytest.fixture
def lease_folder(tmp_path, monkeypatch):
    folder = tmp_path / "leases"
    monkeypatch.setenv(leases.LEASES_ENV, str(folder))
    return folder


def _actor_device(index: int = 0, node: str = "10.0.0.2") -> dict:
    return Device("cpu", index, (index,), node=node).to_json()


def _config(sweep: str = "s1") -> dict:
    return {"sweep": sweep, "study": "raystudy"}


def test_an_actor_waits_for_a_lease_a_local_sweep_holds_says_who_holds_it_and_takes_it_once_free(lease_folder):
    local = DeviceLeases([Device("cpu", 0, (0,))], folder=lease_folder, study="local")
    assert local.take_free() == []
    lease = ActorLease(_config(), _actor_device(), actor_lease_names(_actor_device(), None))
    said = lease.take(seconds=0.3)
    assert said is not None and "sweep of study 'local'" in said and f"pid {os.getpid()}" in said
    local.release()
    assert lease.take(seconds=0.3) is None
    # now the actor holds it: a local sweep waits for it, told that the Ray sweep's worker holds it; and
    # ``optuna-saturn devices`` shows it like any other
    again = DeviceLeases([Device("cpu", 0, (0,))], folder=lease_folder, study="local")
    assert again.take_free() == [Device("cpu", 0, (0,))]
    told: list[str] = []
    assert not again.wait_for_all(deadline=time.monotonic(), say=told.append)
    assert "Ray sweep of study 'raystudy' (its worker of 10.0.0.2/cpu:0" in told[0], told
    [(name, holder)] = current_leases(lease_folder)
    assert name == "cpu-core-0" and holder is not None and holder.ray_sweep == "s1"


def test_an_actors_gpu_lease_is_the_one_a_local_sweep_takes_for_that_gpu(monkeypatch):
    """The GPU Ray gave the actor (an entry of its node's mask, here a UUID) is named as a local sweep names it,
    whatever index each gives it."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaa,GPU-bbb")
    local = leases.lease_names(Device("cuda", 1))
    ray_device = Device("cuda", 0, node="10.0.0.2").to_json()
    assert actor_lease_names(ray_device, "GPU-bbb") == local == ["cuda-GPU-bbb.lease"]


def test_a_ray_sweeps_actors_share_a_machines_cores_but_another_sweeps_wait_and_a_successor_waits_quietly(lease_folder):
    """Two Ray nodes of one sweep on one machine (``ray.cluster_utils``, two network namespaces) are one sweep
    that splits its machine as told: their actors do not wait for each other. Another Ray sweep's actor waits; a
    device's new actor waits for its previous one, which is on its way out, without a word."""
    first = ActorLease(_config(), _actor_device(0, "a"), ["cpu-core-0.lease"])
    assert first.take(seconds=0) is None
    assert ActorLease(_config(), _actor_device(0, "b"), ["cpu-core-0.lease"]).take(seconds=0) is None
    other = ActorLease(_config("s2"), _actor_device(0, "a"), ["cpu-core-0.lease"]).take(seconds=0)
    assert other is not None and "its worker of a/cpu:0" in other
    assert ActorLease(_config(), _actor_device(0, "a"), ["cpu-core-0.lease"]).take(seconds=0) == ""


def test_leasing_off_in_the_driver_holds_for_its_actors(lease_folder, monkeypatch):
    local = DeviceLeases([Device("cpu", 0, (0,))], folder=lease_folder, study="local")
    assert local.take_free() == []
    monkeypatch.setenv(leases.LEASES_ENV, str(lease_folder))  # (the actor's own environment: its raylet's)
    assert ActorLease({**_config(), "leases": "off"}, _actor_device(), ["cpu-core-0.lease"]).take(0) is None


def test_an_actor_starts_for_real_only_once_its_device_is_leased(lease_folder, monkeypatch, tmp_path):
    monkeypatch.setattr(os, "environ", dict(os.environ))  # (the actor sets its worker environment)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # (where it keeps its sweep's folder)
    started: list[bool] = []
    monkeypatch.setattr(DeviceActor, "_start", lambda self: started.append(True) or object())
    local = DeviceLeases([Device("cpu", 0, (0,))], folder=lease_folder, study="local")
    assert local.take_free() == []
    actor = DeviceActor(_config(), _actor_device())
    answer = actor.ready()
    assert "sweep of study 'local'" in answer["waiting_for"] and not started
    local.release()
    assert actor.ready() == {"pid": os.getpid()} and started == [True]


# -- the pool ----------------------------------------------------------------------------------------------------------
class _Ref:
    pass


class _FakeRay:
    """Ray's ``get`` for the pool's pending calls: each ``ready`` call of the actor answers the next of ``answers``."""

    class exceptions:  # (as ``ray.exceptions``)
        RayError = RuntimeError

    def __init__(self, answers: list[dict]) -> None:
        self.answers = answers

    def get(self, call: object) -> dict:
        return self.answers.pop(0)


class _Handle:
    class ready:  # (as ``handle.ready``)
        @staticmethod
        def remote() -> _Ref:
            return _Ref()


def test_the_pool_does_not_count_a_waiting_device_ready_says_who_holds_it_once_and_asks_again(
    tmp_path, caplog, monkeypatch
):
    from optuna_saturn.pools.ray import RayWorkers, _Actor
    from optuna_saturn.pools.ray_cluster import RayCluster, RayNode

    device = Device("cpu", 0, (0,), node="10.0.0.2")
    monkeypatch.setenv(leases.LEASES_ENV, "off")  # (the driver's: its actors' environment is their raylet's)
    pool = RayWorkers(
        RayCluster((RayNode("10.0.0.2", "n", "10.0.0.2", (device,), "cpu", 1, 1.0),), "10.0.0.1"), log_dir=tmp_path
    )
    assert pool._config["leases"] == "off"
    holder = "alice's sweep of study 'bert' (pid 1, since 09:00:00)"
    pool._ray = _FakeRay([{"waiting_for": holder}, {"waiting_for": holder}, {"pid": 7}])
    first = _Ref()
    pool._actors[0] = _Actor(_Handle(), first)
    pool._calls[first] = ("ready", 0)
    with caplog.at_level(logging.INFO, logger="optuna.saturn.runner"):
        for _ in range(2):
            pool._settle(next(iter(pool._calls)))
            assert pool.ready() == set() and len(pool._calls) == 1 and not pool._start_failures
        pool._settle(next(iter(pool._calls)))
    assert pool.ready() == {0}
    waits = [r.getMessage() for r in caplog.records if "waits for its lease" in r.getMessage()]
    assert waits == [f"Device 10.0.0.2/cpu:0 waits for its lease on its node: held by {holder}."]


# -- a Ray sweep and a local sweep on one machine ----------------------------------------------------------------------
@pytest.mark.launch
def test_a_local_sweep_waits_for_the_devices_a_ray_sweep_on_its_machine_holds(tmp_path):
    _run_here("both", tmp_path)
    result = json.loads((tmp_path / "result.json").read_text())
    held = result["held_while_ray_ran"]
    assert len(held) == 2 and all("Ray sweep of study 'ray'" in h for h in held), held
    assert "Waiting for devices another sweep on this machine holds" in result["local_log"], result["local_log"]
    assert "Ray sweep of study 'ray'" in result["local_log"]
    runs = result["runs"]
    assert [len(runs["ray"]), len(runs["local"])] == [4, 2], runs
    overlapping = [
        (a, b)
        for a in runs["ray"]
        for b in runs["local"]
        if a["start"] < b["end"] and b["start"] < a["end"] and set(a["cores"]) & set(b["cores"])
    ]
    assert not overlapping, overlapping


@pytest.mark.launch
def test_a_ray_device_a_local_sweep_holds_waits_said_once_while_the_ray_sweep_runs_on_the_others(tmp_path):
    """Core 1 is held by a local sweep all along: the Ray sweep says its device 1 waits, once, never counts it a
    failed start, and runs its trials on device 0."""
    done = _run_here("ray-beside-local", tmp_path)
    said = [line for line in done.stderr.splitlines() if "waits for its lease" in line]
    assert len(said) == 1 and "127.0.0.1/cpu:1 waits for its lease on its node: held by" in said[0], done.stderr
    assert "sweep of study 'local'" in said[0] and "failed to start" not in done.stderr
    trials = json.loads((tmp_path / "result.json").read_text())["trials"]
    assert trials == [["COMPLETE", ["127.0.0.1/cpu:0"]]] * 3, trials


def _run_here(mode: str, work: Path) -> subprocess.CompletedProcess:
    """This file run as a script in ``mode``, in a loopback-only network namespace, with its own lease folder
    and a home of its own (ray.init writes ~/.ray/auth_token, with which a later test's cluster refused nodes)."""
    from support import require
    from test_ray_runner import _run_in_its_own_group

    from optuna_saturn.pools.launch_commands import network_isolation_prefix

    require(importlib.util.find_spec("ray") is not None, "Ray", fix="pip install 'ray[default]' (the ray extra)")
    (work / "home").mkdir()
    done = _run_in_its_own_group(
        [*network_isolation_prefix(), sys.executable, os.path.abspath(__file__), mode, str(work)],
        timeout=240,
        env={**os.environ, "HOME": str(work / "home"), leases.LEASES_ENV: str(work / "leases")},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def objective(trial):
    x = trial.suggest_float("x", 0, 1)
    start = time.time()
    while time.time() - start < TRIAL_SECONDS:  # busy: it uses its core
        sum(i * i for i in range(10000))
    ran = {"cores": sorted(os.sched_getaffinity(0)), "start": start, "end": time.time()}
    trial.set_user_attr("ran", ran)
    return x


def _sweep(kind: str, work: Path) -> None:
    import optuna

    from optuna_saturn import SaturnExecutor

    study = optuna.create_study(storage=f"sqlite:///{work}/{kind}.sqlite3", study_name=kind)
    common = dict(log_dir=work / f"runs-{kind}", profile=False, progress="plain", dashboard=False)
    if kind == "local":
        SaturnExecutor(devices=2, strategies=["single"], **common).optimize(study, objective, n_trials=2)
        return
    import ray

    held = DeviceLeases([Device("cpu", 1, (1,))], folder=work / "leases", study="local")
    if kind == "ray-beside-local":  # (this process holds core 1, as a local sweep on it would)
        assert held.take_free() == []
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    executor = SaturnExecutor(runner="ray", devices=2, strategies=["single"], **common)
    executor.optimize(study, objective, n_trials=4 if kind == "ray" else 3)
    ran = [(t.state.name, {**t.user_attrs, **t.system_attrs}.get("saturn:devices")) for t in study.trials]
    (work / "result.json").write_text(json.dumps({"trials": ran}))


def _both(work: Path) -> None:
    """The Ray sweep, then, once its workers hold their leases, the local sweep; both to their end."""
    import optuna

    logs = {kind: work / f"{kind}.log" for kind in ("ray", "local")}
    sweeps: dict[str, subprocess.Popen] = {}

    def start(kind: str) -> None:
        with open(logs[kind], "w") as log:
            command = [sys.executable, os.path.abspath(__file__), kind, str(work)]
            sweeps[kind] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    try:
        start("ray")
        deadline = time.monotonic() + 150
        while "workers ready on 2 device(s)" not in logs["ray"].read_text() and sweeps["ray"].poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError("the Ray sweep's workers did not come up:\n" + logs["ray"].read_text()[-3000:])
            time.sleep(0.2)
        held = [h.describe() for _, h in current_leases(work / "leases") if h is not None]
        start("local")
        for kind in ("ray", "local"):
            sweeps[kind].wait(timeout=180)
    finally:
        for process in sweeps.values():
            with contextlib.suppress(ProcessLookupError):
                process.kill()
    runs = {
        kind: [
            t.user_attrs["ran"]
            for t in optuna.load_study(study_name=kind, storage=f"sqlite:///{work}/{kind}.sqlite3").trials
            if "ran" in t.user_attrs
        ]
        for kind in ("ray", "local")
    }
    result = {"held_while_ray_ran": held, "local_log": logs["local"].read_text(), "runs": runs}
    (work / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    mode, folder = sys.argv[1], Path(sys.argv[2])
    if mode == "both":
        _both(folder)
    else:
        _sweep(mode, folder)
