"""The Ray runner (``SaturnExecutor(runner="ray")``): its parts alone; a node that joins a ``ray.cluster_utils``
cluster inside a loopback-only network namespace; and real sweeps on two "hosts", network namespaces joined by a
veth pair, a Ray head on one and a worker node on the other, so that nothing Ray, PostgreSQL or a trial starts
listens outside them (DESIGN decision 9). ``tests/ray_cluster_sweep.py`` runs each sweep; its ``spread`` and
``node-death`` modes also run on a ``ray.cluster_utils`` cluster alone, for debugging without root."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from support import require

from optuna_saturn import SaturnExecutor
from optuna_saturn.channel import AuthenticationFailed, ChannelClient, ChannelServer
from optuna_saturn.devices import Device
from optuna_saturn.planner import Assignment, Option
from optuna_saturn.pools.launch_commands import network_isolation_prefix
from optuna_saturn.pools.ray_cluster import _kind_and_count
from optuna_saturn.sweep.topology import Topology
from optuna_saturn.worker.objective_recipe import describe_objective, load_objective, localized, portable

HERE = os.path.dirname(os.path.abspath(__file__))


def _two_nodes() -> list[Device]:
    return [Device("cpu", i, (i,), node=node) for node in ("a", "b") for i in range(2)] + [
        Device("cpu", 0, (0,), node="c")
    ]


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
        # a peer without the token gets an authentication error, and the connection is closed before any
        # request is served
        with pytest.raises(AuthenticationFailed, match="refused this worker"):
            ChannelClient(server.address, "0" * 32)
        port = int(server.address.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as raw:
            raw.sendall(b'{"op": "hello", "token": "guess"}\n{"op": "suggest"}\n')
            reply = raw.makefile("rb").read()
        assert json.loads(reply) == {"ok": False, "type": "AuthenticationFailed", "error": json.loads(reply)["error"]}


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


def test_a_script_objective_runs_from_the_private_copy_not_from_a_file_changed_since(tmp_path):
    """Where the node sees the script's path too (the executor's own machine, a shared folder), the worker still
    runs the copy it was sent: comparing the file and running it later would run whatever it holds by then. The
    copy runs as the script (its ``__file__`` is the original's)."""
    script = tmp_path / "sweep.py"
    script.write_text("import os\ndef objective(trial):\n    return os.path.basename(__file__)\n")
    recipe = {"kind": "file", "path": str(script), "qualname": "objective", "sys_path": []}
    travelling = portable(recipe)
    there = tmp_path / "there"
    there.mkdir(mode=0o700)
    local = localized(travelling, str(there))
    script.write_text("def objective(trial):\n    return 'swapped'\n")  # changed after it was sent
    assert local["path"].startswith(str(there))
    assert load_objective(local)(None) == "sweep.py"


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
    with pytest.raises(ValueError, match=r"one of \['local', 'ray', 'slurm'\]"):
        SaturnExecutor(devices=1, runner="kubernetes")
    with pytest.raises(ValueError, match="runner='ray'"):
        SaturnExecutor(devices=1, ray_address="127.0.0.1:6379")
    with pytest.raises(ValueError, match="isolate_network"):
        SaturnExecutor(devices=1, runner="ray", isolate_network=True)


def test_a_ray_pool_leaves_out_the_strategies_whose_launcher_must_own_the_processes(caplog):
    """A trial runs in warm workers that are Ray actors: a strategy whose launcher starts the trial's processes
    (DeepSpeed's launcher, accelerate launch) cannot run there. Among all the known ones it is left out, said in
    the log; named by the user, it is an error that names the fix."""
    from optuna_saturn.pools.ray_kind import RayPool
    from optuna_saturn.strategy import load_strategies, parse_strategy

    launched = parse_strategy({"name": "zero2-ds", "launcher": "deepspeed", "engine": "deepspeed"}, source="t")
    known = [load_strategies()["ddp"], launched]
    with caplog.at_level("INFO", logger="optuna.saturn"):
        assert [s.name for s in RayPool().runnable(known, None)] == ["ddp"]
    assert "leaves out ['zero2-ds']" in caplog.text
    with pytest.raises(ValueError, match="use runner='local'"):
        RayPool().runnable(known, ["ddp", "zero2-ds"])


# -- real sweeps on a two-node cluster ---------------------------------------------------------------------------------
def _sweep_on_a_ray_cluster(mode: str, tmp_path) -> dict:
    require(importlib.util.find_spec("ray") is not None, "Ray", fix="pip install 'ray[default]' (the ray extra)")
    require(
        bool(shutil.which("unshare") and shutil.which("ip")),
        "unshare or ip (util-linux, iproute2)",
        fix="install util-linux and iproute2",
    )
    out = tmp_path / f"{mode}.json"
    done = _run_in_its_own_group(
        [*network_isolation_prefix(), sys.executable, os.path.join(HERE, "ray_cluster_sweep.py"), mode, str(out)],
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(out.read_text())


def _run_in_its_own_group(
    command: list[str], *, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run ``command``; past ``timeout``, kill it with everything it started (Ray's processes too)."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        stderr += f"\n(killed after {timeout} s)"
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _check_spread(result: dict, ips: set[str]) -> None:
    """Every trial of the ``spread`` sweep completed, on both nodes, each inside one, in the nodes' actors;
    each DDP trial really trained as one job; every rank's log came back."""
    assert result["storage"].startswith("postgresql"), "the study lives in PostgreSQL"
    trials = result["trials"]
    assert [t["state"] for t in trials] == ["COMPLETE"] * 6
    assert {t["attrs"]["saturn:node"]["ip"] for t in trials} == ips, "the trials did not spread over both nodes"
    assert "ddp" in {t["attrs"]["saturn:strategy"] for t in trials}
    for trial in trials:
        attrs = trial["attrs"]
        node = attrs["saturn:node"]["name"]
        assert all(d.startswith(node + "/") for d in attrs["saturn:devices"]), attrs["saturn:devices"]
        pids = attrs["pids"]
        assert result["driver_pid"] not in pids  # it ran in the node's actors, not in the executor
        assert attrs["world_size"] == attrs["saturn:num_devices"] == len(set(pids))
        if attrs["saturn:strategy"] == "ddp":
            assert attrs["max_param_diff_across_ranks"] == 0.0
        for rank in range(attrs["world_size"]):
            assert f"runs trial-{trial['number']} as rank {rank} of {attrs['world_size']}" in trial["log"]


def _check_node_death(result: dict) -> None:
    """The trial on the node that died ended FAIL with the reason and ran again, to the end, on the node left,
    from its checkpoint; no trial stays RUNNING; ``n_trials`` counted new trials."""
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
    # from the checkpoint the dead node's run saved in the shared checkpoint_dir, not from the start
    assert again[0]["attrs"].get("saturn:resumed_from_step", 0) >= 4, again[0]["attrs"]
    new = [t for t in trials.values() if "saturn:retry_of" not in t["attrs"]]
    assert len(new) == 3, "n_trials counts new trials; the retry comes on top"
    assert sum(t["state"] == "COMPLETE" for t in new) == 2


@pytest.mark.launch
def test_two_sweeps_on_one_ray_cluster_take_its_device_in_turn(tmp_path):
    """On Ray, the cluster's own resources give a device to one sweep at a time (optuna-saturn's device leases are
    for one machine): two sweeps of two studies started at once on a one-device cluster both complete, and their
    trials never overlap on it."""
    result = _sweep_on_a_ray_cluster("two-sweeps", tmp_path)
    assert result["errors"] == []
    runs = result["runs"]
    assert [r["state"] for r in runs] == ["COMPLETE"] * 4
    runs.sort(key=lambda r: r["start"])
    assert all(a["end"] <= b["start"] for a, b in itertools.pairwise(runs)), runs  # (one device: one at a time)


@pytest.mark.launch
def test_a_ray_node_that_joins_during_a_sweep_runs_its_later_trials(tmp_path):
    result = _sweep_on_a_ray_cluster("node-joins", tmp_path)
    trials = result["trials"]
    assert [t["state"] for t in trials] == ["COMPLETE"] * 8
    on_new = [t for t in trials if t["attrs"]["saturn:node"]["node_id"] == result["joined_node"]]
    assert on_new, "no trial ran on the node that joined"
    started = [t["attrs"]["saturn:sweep_started_at"] + t["attrs"]["saturn:actual_start"] for t in on_new]
    assert min(started) > result["added_at"]


@pytest.mark.launch
def test_under_a_deadline_a_ray_node_no_trial_left_needs_goes_back_to_the_cluster(tmp_path):
    """Three 3 s trials on two one-device nodes, a deadline of an hour: once the last trial runs, the other node's
    placement group is removed (Ray has its device back) while the sweep goes on, and every trial completes."""
    result = _sweep_on_a_ray_cluster("release", tmp_path)
    assert [t["state"] for t in result["trials"]] == ["COMPLETE"] * 3
    released = result["summary"]["released"]
    assert len(released) == 1, result["summary"]
    assert ["CREATED", "REMOVED"] in result["groups_seen"], result["groups_seen"]  # (one node's group gone)
    node = next(iter(released)).split("/")[0]
    late = [t for t in result["trials"] if t["attrs"]["saturn:actual_start"] >= released[next(iter(released))]]
    assert all(t["attrs"]["saturn:node"]["name"] != node for t in late)
    summary = result["summary"]
    assert summary["held_device_seconds"] < 2 * summary["wall_seconds"]


# -- two "hosts": network namespaces joined by a veth pair -------------------------------------------------------------
class NamespaceHosts:
    """Two hosts on this machine: network namespaces joined by a veth pair, each with its own IP on a private
    /24 that exists only between them (DESIGN decision 9). Everything started in them is stopped by PID
    (``ip netns pids``) and the namespaces are deleted."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.names = [f"saturn-{tag}-h0", f"saturn-{tag}-h1"]
        self.ips = [f"10.213.{os.getpid() % 250}.1", f"10.213.{os.getpid() % 250}.2"]
        self._veth = [f"sv{tag}a", f"sv{tag}b"]
        self.temp = [tempfile.mkdtemp(prefix="sr"), tempfile.mkdtemp(prefix="sr")]  # short: socket paths

    def __enter__(self) -> NamespaceHosts:
        try:
            _ip("link", "add", self._veth[0], "type", "veth", "peer", "name", self._veth[1])
            for name, veth, ip in zip(self.names, self._veth, self.ips):
                _ip("netns", "add", name)
                _ip("link", "set", veth, "netns", name)
                _ip("-n", name, "addr", "add", f"{ip}/24", "dev", veth)
                _ip("-n", name, "link", "set", veth, "up")
                _ip("-n", name, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def start(self, host: int, command: list[str], log: str) -> subprocess.Popen:
        with open(log, "ab") as out:
            return subprocess.Popen(
                ["ip", "netns", "exec", self.names[host], *command],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def run(self, host: int, command: list[str], timeout: float) -> subprocess.CompletedProcess:
        return _run_in_its_own_group(["ip", "netns", "exec", self.names[host], *command], timeout=timeout)

    def pids(self, host: int) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.names[host]], capture_output=True, text=True, check=False)
        return [int(p) for p in out.stdout.split()]

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "link", "del", self._veth[0]], capture_output=True, check=False)  # (if never moved)
        for host, name in enumerate(self.names):
            for pid in self.pids(host):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", name], check=False)
        for folder in self.temp:
            shutil.rmtree(folder, ignore_errors=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _listening_ray() -> set[tuple[str, int]]:
    """Sockets of Ray's processes (or of the executor's actors) listening in this, the machine's own, namespace."""
    found = set()
    for connection in psutil.net_connections("inet"):
        if connection.status != psutil.CONN_LISTEN or connection.pid is None:
            continue
        try:
            process = psutil.Process(connection.pid)
            name, command = process.name(), " ".join(process.cmdline())
        except psutil.Error:
            continue
        if name in ("raylet", "gcs_server") or command.startswith("ray::") or "/site-packages/ray/" in command:
            found.add((connection.laddr.ip, connection.laddr.port))
    return found


def _raylet(hosts: NamespaceHosts, host: int) -> int:
    for pid in hosts.pids(host):
        try:
            if Path(f"/proc/{pid}/comm").read_text(encoding="ascii").strip() == "raylet":
                return pid
        except OSError:
            pass
    raise AssertionError(f"no raylet runs on host {host}")


@pytest.mark.launch
def test_two_network_namespace_hosts_run_a_sweep_and_survive_the_kill_of_one_raylet(tmp_path):
    """A Ray head on one host, a Ray worker node on the other, each with its own IP; the executor on the head's
    host. A sweep spreads over both (a DDP trial inside one host); then a second sweep, whose trial on the worker
    host loses its raylet (kill -9), is planned on the head's host again. Nothing listens outside these
    namespaces."""
    require(importlib.util.find_spec("ray") is not None, "Ray", fix="pip install 'ray[default]' (the ray extra)")
    require(os.geteuid() == 0 and bool(shutil.which("ip")), "root and iproute2 (ip netns)", fix="run as root")
    before = _listening_ray()
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    with NamespaceHosts() as hosts:
        head = f"{hosts.ips[0]}:6379"
        common = ["--num-cpus=2", "--disable-usage-stats", "--block"]
        hosts.start(
            0,
            [
                ray_bin,
                "start",
                "--head",
                f"--node-ip-address={hosts.ips[0]}",
                "--port=6379",
                "--include-dashboard=false",
                f"--temp-dir={hosts.temp[0]}",
                *common,
            ],
            str(tmp_path / "head.log"),
        )
        time.sleep(1)
        worker_start = [
            ray_bin,
            "start",
            f"--address={head}",
            f"--node-ip-address={hosts.ips[1]}",
            f"--temp-dir={hosts.temp[1]}",
            *common,
        ]
        hosts.start(1, worker_start, str(tmp_path / "worker.log"))
        _wait_for_nodes(hosts, head, 2)
        assert _listening_ray() <= before, "a Ray process listens outside the namespaces"
        script = os.path.join(HERE, "ray_cluster_sweep.py")
        results = {}
        for mode in ("spread", "node-death"):
            # (the sweep script fails, saying so, where the worker host's node is gone before its raylet is killed)
            extra = {"address": head, "raylet_pid": _raylet(hosts, 1), "worker_ip": hosts.ips[1]}
            done = hosts.run(
                0, [sys.executable, script, mode, str(tmp_path / f"{mode}.json"), json.dumps(extra)], timeout=240
            )
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
            results[mode] = json.loads((tmp_path / f"{mode}.json").read_text())
        _check_spread(results["spread"], set(hosts.ips))
        _check_node_death(results["node-death"])
        assert _listening_ray() <= before
    assert _listening_ray() <= before


def _wait_for_nodes(hosts: NamespaceHosts, head: str, count: int) -> None:
    """Until ``count`` nodes are alive: one driver that looks every half second (not a Python and a ``ray.init``
    per look)."""
    probe = (
        f"import ray, time; ray.init(address={head!r}, log_to_driver=False); deadline = time.monotonic() + 90\n"
        f"while sum(n['Alive'] for n in ray.nodes()) < {count} and time.monotonic() < deadline: time.sleep(0.5)\n"
        "print(sum(n['Alive'] for n in ray.nodes()))"
    )
    deadline = time.monotonic() + 90
    while True:  # (again where the driver could not connect: the head not up yet)
        done = hosts.run(0, [sys.executable, "-c", probe], timeout=120)
        alive = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else []
        if alive == [str(count)] or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert alive == [str(count)], f"the cluster did not reach {count} nodes: {done.stdout[-2000:]}{done.stderr[-3000:]}"
