"""The Ray runner (``SaturnExecutor(runner="ray")``): its parts alone, then real sweeps on a two-node Ray cluster
started on this machine (``ray.cluster_utils.Cluster``) inside a loopback-only network namespace, so that nothing
Ray, PostgreSQL or a trial starts listens outside it (DESIGN decision 9)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from optuna_saturn import SaturnExecutor
from optuna_saturn._objective_ref import describe_objective, load_objective, localized, portable
from optuna_saturn._topology import Topology
from optuna_saturn.channel import ChannelClient, ChannelServer, RemoteError
from optuna_saturn.devices import Device
from optuna_saturn.planner import Assignment, Option
from optuna_saturn.runner.launch import network_isolation_prefix
from optuna_saturn.runner.ray_cluster import _kind_and_count
from support import require

HERE = os.path.dirname(os.path.abspath(__file__))


def _two_nodes() -> list[Device]:
    return [Device("cpu", i, (i,), node=node) for node in ("a", "b") for i in range(2)] + [Device("cpu", 0, (0,), node="c")]


# -- the parts ---------------------------------------------------------------------------------------------------------
def test_the_topology_keeps_a_trial_inside_one_node_and_maps_the_planners_devices():
    topology = Topology.of(_two_nodes())
    assert topology.cluster.nodes == (2, 2, 1)
    assert topology.pick({1, 2, 3}, 2) == [2, 3]  # not 1 and 2: they are on two nodes
    assert topology.pick({1, 2, 4}, 2) is None
    assert topology.pick({0, 1, 4}, 1) == [4]  # the node with fewest left over: whole nodes stay free
    option = Option("ddp", 2, 10.0)
    local = Assignment("7", option, node=1, devices=(0, 1), start=0.0, end=10.0)
    assert topology.to_global(local).devices == (2, 3)
    assert topology.to_local(topology.to_global(local)) == local
    reservation = topology.reservation((2, 3), 5.0, "trial-7")
    assert (reservation.node, reservation.devices) == (1, (0, 1))


def test_a_node_that_died_leaves_the_topology_and_the_others_keep_their_devices():
    topology = Topology.of(_two_nodes(), without={0, 1})
    assert topology.cluster.nodes == (2, 1)
    # an assignment planned before, on node "b" (global devices 2, 3): its node index shifted from 1 to 0
    kept = Assignment("3", Option("ddp", 2, 10.0), node=1, devices=(2, 3), start=0.0, end=10.0)
    assert topology.to_local(kept).node == 0
    assert topology.pick({0, 1, 2, 3, 4}, 2) == [2, 3]


def test_the_tcp_channel_serves_a_registered_token_only_and_never_binds_every_interface():
    with pytest.raises(ValueError, match="not all"):
        ChannelServer(host="0.0.0.0")
    with ChannelServer(host="127.0.0.1") as server:
        assert server.address.startswith("tcp://127.0.0.1:")
        token = server.register(lambda op, message: {"op": op, "x": message.get("x")})
        client = ChannelClient(server.address, token)
        assert client.call("echo", x=3) == {"op": "echo", "x": 3}
        client.close()
        # a peer without the token gets nothing: the connection is closed before any request is served
        with pytest.raises(ConnectionError):
            ChannelClient(server.address, "0" * 32)
        port = int(server.address.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as raw:
            raw.sendall(b'{"op": "hello", "token": "guess"}\n{"op": "suggest"}\n')
            assert raw.recv(100) == b""


def test_an_objective_travels_inside_its_recipe_to_a_machine_without_the_file(tmp_path):
    recipe = describe_objective(lambda trial: 42.0, str(tmp_path))  # a lambda: pickled by value
    assert recipe["kind"] == "pickle"
    travelling = portable(recipe)
    os.unlink(recipe["path"])  # "the other machine" does not have it
    there = tmp_path / "there"
    there.mkdir()
    local = localized(travelling, str(there))
    assert local["path"].startswith(str(there)) and "content" not in local
    assert load_objective(local)(None) == 42.0


def test_devices_are_read_per_node_with_clear_errors():
    assert _kind_and_count("auto", 8, 0, "n") == ("cpu", 8)
    assert _kind_and_count("auto", 16, 4, "n") == ("cuda", 4)
    assert _kind_and_count(2, 8, 0, "n") == ("cpu", 2)
    assert _kind_and_count("cpu:4", 16, 4, "n") == ("cpu", 4)
    with pytest.raises(ValueError, match="has 2 CPUs"):
        _kind_and_count(3, 2, 0, "n")
    with pytest.raises(ValueError, match="no GPU"):
        _kind_and_count("cuda", 2, 0, "n")
    with pytest.raises(ValueError, match="read per node"):
        _kind_and_count([0, 1], 2, 0, "n")


def test_the_runner_options_say_what_is_wrong():
    with pytest.raises(ValueError, match="'local' or 'ray'"):
        SaturnExecutor(devices=1, runner="slurm")
    with pytest.raises(ValueError, match="runner='ray'"):
        SaturnExecutor(devices=1, ray_address="127.0.0.1:6379")
    with pytest.raises(ValueError, match="isolate_network"):
        SaturnExecutor(devices=1, runner="ray", isolate_network=True)


# -- real sweeps on a two-node cluster -----------------------------------------------------------------------------------
def _sweep_on_a_ray_cluster(mode: str, tmp_path) -> dict:
    pytest.importorskip("ray", reason="pip install 'optuna-saturn[ray]'")
    require(bool(shutil.which("unshare") and shutil.which("ip")), "unshare or ip (util-linux, iproute2)",
            fix="install util-linux and iproute2")
    out = tmp_path / f"{mode}.json"
    done = subprocess.run(
        network_isolation_prefix() + [sys.executable, os.path.join(HERE, "ray_cluster_sweep.py"), mode, str(out)],
        capture_output=True, text=True, timeout=280, check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(out.read_text())


@pytest.mark.launch
def test_a_sweep_spreads_over_two_ray_nodes_with_each_ddp_trial_inside_one(tmp_path):
    result = _sweep_on_a_ray_cluster("spread", tmp_path)
    assert result["storage"].startswith("postgresql"), "the study lives in PostgreSQL"
    trials = result["trials"]
    assert [t["state"] for t in trials] == ["COMPLETE"] * 6
    nodes = {t["attrs"]["saturn:node"]["name"] for t in trials}
    assert len(nodes) == 2, f"trials ran on {nodes} only"
    strategies = {t["attrs"]["saturn:strategy"] for t in trials}
    assert "ddp" in strategies, strategies
    for trial in trials:
        attrs = trial["attrs"]
        node = attrs["saturn:node"]["name"]
        assert all(d.startswith(node + "/") for d in attrs["saturn:devices"]), attrs["saturn:devices"]
        pids = attrs["pids"]
        assert result["driver_pid"] not in pids  # it ran in the node's actors, not in the executor
        assert attrs["world_size"] == attrs["saturn:num_devices"] == len(set(pids))
        if attrs["saturn:strategy"] == "ddp":
            assert attrs["max_param_diff_across_ranks"] == 0.0  # it really trained as one DDP job
        # its log came back to the executor's folder, every rank's part of it
        for rank in range(attrs["world_size"]):
            assert f"runs trial-{trial['number']} as rank {rank} of {attrs['world_size']}" in trial["log"]


@pytest.mark.launch
def test_a_trial_on_a_ray_node_that_dies_fails_with_the_reason_and_runs_again_on_the_node_left(tmp_path):
    result = _sweep_on_a_ray_cluster("node-death", tmp_path)
    trials = {t["number"]: t for t in result["trials"]}
    victim = trials[result["victim"]]
    assert result["removed_at"] is not None
    assert victim["state"] == "FAIL"
    reason = victim["attrs"]["saturn:fail_reason"]
    assert "Ray node" in reason and victim["attrs"]["saturn:node"]["node_id"] == result["worker_node"], reason
    assert not [t for t in trials.values() if t["state"] in ("RUNNING", "WAITING")]
    again = [t for t in trials.values() if t["attrs"].get("saturn:retry_of") == victim["number"]]
    assert len(again) == 1 and again[0]["state"] == "COMPLETE"
    assert again[0]["attrs"]["saturn:node"]["node_id"] != result["worker_node"]
    new = [t for t in trials.values() if "saturn:retry_of" not in t["attrs"]]
    assert len(new) == 3, "n_trials counts new trials; the retry comes on top"
    assert sum(t["state"] == "COMPLETE" for t in new) == 2
