"""The real SLURM cluster the tests use (``tests/slurm_cluster.py``): two ``slurmd`` nodes of two CPUs, each in a
network namespace of its own, run what ``srun`` and ``sbatch`` give them on the right node; a job's processes reach
a TCP server in the controller's namespace (where the executor runs: the channel's way); nothing listens on the
machine's own interfaces; a node whose ``slurmd`` is killed is seen DOWN in bounded time (what the SLURM pool's
fault handling waits on); and ``stop`` leaves no daemon and no namespace behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import slurm_cluster
from support import require

_SERVER = """
import socket, sys
server = socket.create_server((sys.argv[1], 0))
print(server.getsockname()[1], flush=True)
for _ in range(int(sys.argv[2])):
    connection, _ = server.accept()
    print(connection.makefile().readline().strip(), flush=True)
"""


def _listening_in_this_namespace(pids: set[int]) -> list:
    """The listening sockets of ``pids`` that this (the machine's own) network namespace holds."""
    return [c for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN and c.pid in pids]


def _daemons() -> set[int]:
    """The SLURM and MUNGE daemons running now (not the zombies a container's PID 1 may leave unreaped)."""
    return {
        p.pid
        for p in psutil.process_iter(["name", "status"])
        if p.info["name"] in ("munged", "slurmctld", "slurmd") and p.info["status"] != psutil.STATUS_ZOMBIE
    }


def _namespaces() -> set[str]:
    return set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split())


@pytest.mark.launch
def test_two_slurm_nodes_run_jobs_on_their_own_hosts_and_a_killed_slurmd_is_seen_down():
    require(os.geteuid() == 0, "root (network namespaces, SLURM's daemons)", fix="run the tests as root")
    missing = slurm_cluster.missing_tools()
    require(not missing, f"{', '.join(missing)} (SLURM, MUNGE, iproute2, util-linux)", fix="run .ci/install-slurm")
    before_daemons, before_namespaces = _daemons(), _namespaces()
    folder = tempfile.mkdtemp(prefix="saturn-slurm-")  # (short: munge's socket path must fit in 108 bytes)
    try:
        started = time.monotonic()
        cluster = slurm_cluster.start(folder)
        print(f"cluster up in {time.monotonic() - started:.1f} s")
        ours = _daemons() - before_daemons
        assert len(ours) == 4, ours  # munged, slurmctld, two slurmd
        assert cluster.states() == {"node0": "idle", "node1": "idle"}
        assert not _listening_in_this_namespace(ours), "a SLURM daemon listens on the machine's own interfaces"

        # srun: one task on each node, each on its own host (hostname, address)
        done = cluster.run("srun", "-N2", "--ntasks-per-node=1", "sh", "-c", 'echo "$(hostname) $(hostname -I)"')
        assert done.returncode == 0, done.stderr
        assert sorted(tuple(line.split()) for line in done.stdout.splitlines()) == sorted(cluster.nodes.items())
        for name in cluster.nodes:
            done = cluster.run("srun", f"--nodelist={name}", "hostname")
            assert done.stdout.strip() == name, done.stderr

        _check_a_batch_job(cluster, Path(folder))

        # a slurmd killed: the controller sets its node DOWN, within SlurmdTimeout and a few pings
        victim = int(Path(folder, "run", "slurmd-node1.pid").read_text())
        os.kill(victim, signal.SIGKILL)
        killed, deadline = time.monotonic(), time.monotonic() + 3 * slurm_cluster.SLURMD_TIMEOUT_S + 30
        while not cluster.states()["node1"].startswith("down"):
            assert time.monotonic() < deadline, f"node1 is not DOWN {deadline - killed:.0f} s after: {cluster.states()}"
            time.sleep(1)
        print(f"node1 DOWN {time.monotonic() - killed:.1f} s after its slurmd was killed")
        assert cluster.states()["node0"] == "idle"
        done = cluster.run("srun", "-N1", "hostname")  # (the other node still runs jobs)
        assert done.stdout.strip() == "node0", done.stderr
    finally:
        slurm_cluster.stop(folder)
        shutil.rmtree(folder, ignore_errors=True)
    deadline = time.monotonic() + 10
    while _daemons() - before_daemons and time.monotonic() < deadline:  # (ended, but not reaped yet)
        time.sleep(0.2)
    assert not _daemons() - before_daemons, "a daemon outlived stop()"
    assert _namespaces() == before_namespaces


def _check_a_batch_job(cluster: slurm_cluster.SlurmCluster, folder: Path) -> None:
    """An sbatch job of both nodes, whole: its script reads the allocation from SLURM's environment, its srun starts
    one task per node, and each task writes a file and reaches a TCP server in the controller's namespace."""
    server = subprocess.Popen(
        cluster.command(sys.executable, "-c", _SERVER, cluster.controller, "2"), stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(server.stdout.readline())
        script = folder / "job.sh"
        script.write_text(
            "#!/bin/bash\n"
            f'scontrol show hostnames "$SLURM_JOB_NODELIST" > {folder}/hosts.txt\n'
            f'srun --ntasks-per-node=1 bash -c \'echo "$SLURMD_NODENAME $SLURM_CPUS_ON_NODE $SLURM_NODEID"'
            f" > {folder}/task-$SLURMD_NODENAME.txt;"
            f' echo "$SLURMD_NODENAME $(hostname -I)" > /dev/tcp/{cluster.controller}/{port}\'\n',
            encoding="utf-8",
        )
        done = cluster.run("sbatch", "--parsable", "-N2", "--exclusive", f"--output={folder}/job.out", str(script))
        assert done.returncode == 0, done.stderr
        state = cluster.wait_for_job(done.stdout.strip())
        assert state == "COMPLETED", state + (folder / "job.out").read_text(errors="replace")
        heard = sorted(tuple(server.stdout.readline().split()) for _ in cluster.nodes)
    finally:
        server.kill()
        server.wait()
    assert (folder / "hosts.txt").read_text().split() == sorted(cluster.nodes)
    tasks = sorted((folder / f"task-{name}.txt").read_text().split() for name in cluster.nodes)
    assert tasks == [["node0", "2", "0"], ["node1", "2", "1"]], tasks  # (whole nodes: both CPUs of each)
    assert heard == sorted(cluster.nodes.items()), heard  # (each from its own address)
