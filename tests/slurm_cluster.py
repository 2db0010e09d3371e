"""A real SLURM cluster on this machine, for the tests and CI: Debian's ``slurm-wlm`` and ``munge``
(``.ci/install-slurm``), one ``munged``, one ``slurmctld`` and two ``slurmd`` nodes of two CPUs each.

Each daemon's host is a network namespace of its own (DESIGN decision 9: nothing listens on the machine's own
interfaces): the controller's namespace ``saturn-<tag>-ctl`` holds a bridge with the cluster's only non-loopback
address; each node's namespace ``saturn-<tag>-nodeN`` is joined to that bridge by a veth pair created directly
inside the namespaces, with an address on a private /24 that exists only between them. Each daemon also has a
UTS namespace of its own, so that its hostname is its ``NodeName`` (what ``srun hostname`` shows). No system file
is read or changed: the munge key, ``slurm.conf``, sockets, spool, state, logs and PID files all live in the
cluster's folder, and every client finds them through ``SLURM_CONF`` (which names munge's socket too).

- :func:`start` writes the folder, starts the daemons and waits until ``sinfo`` shows every node idle; it returns
  what a client needs (:class:`SlurmCluster`), also written to ``FOLDER/cluster.json``.
- :func:`stop` kills every daemon by its PID file, then whatever else still runs in the namespaces (job steps),
  and deletes the namespaces. It is safe to call twice, or after a failed start.
- :func:`load` reads what :func:`start` wrote, for a client in another process.
- ``python tests/slurm_cluster.py start FOLDER`` prints the JSON (``.ci/run`` does this once for the whole run);
  ``stop FOLDER`` stops it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

NODES = 2
CPUS_PER_NODE = 2
PARTITION = "debug"
SLURMD_TIMEOUT_S = 5  # a node whose slurmd is gone is DOWN after this (the SLURM pool's fault tests need it short)
_STARTS = itertools.count()  # (clusters this process started: a part of their namespaces' names)
_TOOLS = ("munged", "slurmctld", "slurmd", "sinfo", "srun", "sbatch", "scontrol", "ip", "unshare")


@dataclass(frozen=True)
class SlurmCluster:
    """What a client needs: run SLURM's commands inside ``namespace`` (``ip netns exec``, see :meth:`command`)
    with ``env`` added to the environment."""

    folder: str
    conf: str  # slurm.conf; SLURM_CONF
    namespace: str  # the controller's network namespace: where srun, sbatch and the executor run
    controller: str  # the controller's address (reachable from every node)
    nodes: dict[str, str]  # NodeName -> its address (and its hostname)
    node_namespaces: dict[str, str]  # NodeName -> its network namespace
    cpus_per_node: int
    partition: str
    env: dict[str, str]

    def command(self, *argv: str) -> list[str]:
        """``argv`` as it runs in the controller's namespace, with the cluster's environment."""
        return ["ip", "netns", "exec", self.namespace, "env", *(f"{k}={v}" for k, v in self.env.items()), *argv]

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(*argv), capture_output=True, text=True, timeout=timeout, check=False)

    def states(self) -> dict[str, str]:
        """Each node's state as ``sinfo`` sees it (``idle``, ``alloc``, ``down*``; a ``*`` means not responding)."""
        done = self.run("sinfo", "--noheader", "--Node", "--format=%N %t", timeout=30)
        return dict(line.split() for line in done.stdout.splitlines() if line.strip())

    def job_state(self, job_id: str) -> str:
        """``PENDING``, ``RUNNING``, ``COMPLETED``, ``FAILED``...; empty once the controller forgot it (MinJobAge)."""
        done = self.run("scontrol", "--oneliner", "show", "job", job_id, timeout=30)
        return next((f.split("=", 1)[1] for f in done.stdout.split() if f.startswith("JobState=")), "")

    def wait_for_job(self, job_id: str, timeout: float = 120) -> str:
        """Its end state. (``sbatch --wait`` polls too slowly: 10 s for a job of a second.)"""
        deadline = time.monotonic() + timeout
        while (state := self.job_state(job_id)) in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {state} after {timeout:.0f} s")
            time.sleep(0.2)
        return state


def missing_tools() -> list[str]:
    return [tool for tool in _TOOLS if shutil.which(tool) is None]


def start(folder: str | os.PathLike, *, timeout: float = 60) -> SlurmCluster:
    """Start the cluster in ``folder`` (created; it must hold no running cluster) and wait until every node is
    idle. Whatever it started is stopped if it fails."""
    if os.geteuid() != 0:
        raise RuntimeError("a SLURM test cluster needs root (network namespaces, daemons as root); run as root")
    if missing := missing_tools():
        raise RuntimeError(f"{', '.join(missing)} not found: install them with .ci/install-slurm")
    cluster = _layout(Path(folder).absolute())
    Path(cluster.folder).mkdir(parents=True, exist_ok=True)
    if (Path(cluster.folder) / "cluster.json").exists():
        raise RuntimeError(f"{cluster.folder} already holds a cluster: stop it first (slurm_cluster.py stop FOLDER)")
    taken = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split())
    for namespace in [cluster.namespace, *cluster.node_namespaces.values()]:
        if namespace in taken:  # (before cluster.json: a failed start's stop must not delete another's namespaces)
            raise RuntimeError(f"network namespace {namespace} exists: stop its cluster, or `ip netns del {namespace}`")
    (Path(cluster.folder) / "cluster.json").write_text(json.dumps(asdict(cluster), indent=1), encoding="utf-8")
    try:
        _make_network(cluster)
        _write_files(cluster)
        _start_daemons(cluster)
        _wait_until_idle(cluster, timeout)
    except BaseException:
        stop(cluster.folder)
        raise
    return cluster


def stop(folder: str | os.PathLike) -> None:
    """Stop the cluster in ``folder``: its daemons by their PID files (SIGTERM, then SIGKILL), then anything left in
    its namespaces; then the namespaces go. ``cluster.json`` goes last, so a failed stop can be run again."""
    record = Path(folder).absolute() / "cluster.json"
    if not record.exists():
        return
    cluster = load(folder)
    run = Path(cluster.folder) / "run"
    daemons = [(run / f"slurmd-{n}.pid", "slurmd") for n in cluster.nodes]
    for pid_file, name in [*daemons, (run / "slurmctld.pid", "slurmctld"), (run / "munged.pid", "munged")]:
        _end(_pid_of(pid_file, name))
    for namespace in [cluster.namespace, *cluster.node_namespaces.values()]:
        for pid in _namespace_pids(namespace):
            _end(pid, grace=0)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
    record.unlink()


def load(folder: str | os.PathLike) -> SlurmCluster:
    """The cluster started in ``folder`` (by another process: ``.ci/run``, through this module's command line)."""
    record = Path(folder).absolute() / "cluster.json"
    return SlurmCluster(**json.loads(record.read_text(encoding="utf-8")))


# -- the folder and the network ----------------------------------------------------------------------------------------
def _layout(folder: Path) -> SlurmCluster:
    pid = os.getpid() % 100000
    tag = f"{pid}-{next(_STARTS)}"  # (one process may run two clusters at once: a test's own beside a shared one)
    subnet = f"10.214.{pid % 250}"  # (private to the cluster's namespaces: another cluster may use it too)
    nodes = {f"node{i}": f"{subnet}.{i + 2}" for i in range(NODES)}
    conf = str(folder / "slurm.conf")
    return SlurmCluster(
        folder=str(folder),
        conf=conf,
        namespace=f"saturn-{tag}-ctl",
        controller=f"{subnet}.1",
        nodes=nodes,
        node_namespaces={name: f"saturn-{tag}-{name}" for name in nodes},
        cpus_per_node=CPUS_PER_NODE,
        partition=PARTITION,
        env={"SLURM_CONF": conf},
    )


def _make_network(cluster: SlurmCluster) -> None:
    """A bridge in the controller's namespace and a veth pair per node, each end created in its namespace (nothing
    is ever made in the machine's own namespace)."""
    ctl = cluster.namespace
    for namespace in [ctl, *cluster.node_namespaces.values()]:
        _ip("netns", "add", namespace)
        _ip("-n", namespace, "link", "set", "lo", "up")
    _ip("-n", ctl, "link", "add", "br0", "type", "bridge")
    _ip("-n", ctl, "addr", "add", f"{cluster.controller}/24", "dev", "br0")
    _ip("-n", ctl, "link", "set", "br0", "up")
    for name, address in cluster.nodes.items():
        namespace = cluster.node_namespaces[name]
        _ip("-n", ctl, "link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        _ip("-n", ctl, "link", "set", name, "master", "br0")
        _ip("-n", ctl, "link", "set", name, "up")
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")


def _write_files(cluster: SlurmCluster) -> None:
    folder = Path(cluster.folder)
    folder.chmod(0o755)  # (munged refuses a socket in a folder that not everyone can enter)
    for part in ("run", "log", "state", "spool"):
        (folder / part).mkdir(exist_ok=True)
    (folder / "munge").mkdir(mode=0o700, exist_ok=True)
    key = folder / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    Path(cluster.conf).write_text(_slurm_conf(cluster), encoding="utf-8")
    # slurmd 22.05 initialises a cgroup plugin even when nothing uses cgroups, and autodetection fails where
    # /sys/fs/cgroup is not mounted (``ip netns exec`` mounts a sysfs of the namespace's own, without it). cgroup/v1
    # named outright initialises without touching any cgroup; with proctrack/linuxproc, task/none and
    # jobacct_gather/none, nothing uses it after. (Read from the folder of slurm.conf.)
    (folder / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n", encoding="utf-8")


def _slurm_conf(cluster: SlurmCluster) -> str:
    f = cluster.folder
    lines = [
        "ClusterName=saturn",
        f"SlurmctldHost=ctl({cluster.controller})",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"AuthInfo=socket={f}/run/munge.socket",  # (every daemon and client: munge's socket of this cluster)
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"StateSaveLocation={f}/state",
        f"SlurmdSpoolDir={f}/spool/%n",
        f"SlurmctldPidFile={f}/run/slurmctld.pid",
        f"SlurmdPidFile={f}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={f}/log/slurmctld.log",
        f"SlurmdLogFile={f}/log/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",  # (no cgroups, no systemd)
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill",
        "MpiDefault=none",
        "SlurmdParameters=config_overrides",  # (a node's CPUs as written here, whatever this machine has)
        "ReturnToService=2",  # (a node whose slurmd comes back is usable again)
        f"SlurmdTimeout={SLURMD_TIMEOUT_S}",
        "SlurmctldTimeout=10",
        "MessageTimeout=5",  # (default 10: a lost slurmd's pings fail sooner, and it is DOWN sooner)
        "InactiveLimit=0",
        "KillWait=5",
        "MinJobAge=60",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
    ]
    for name, address in cluster.nodes.items():
        lines.append(f"NodeName={name} NodeAddr={address} NodeHostname={name} CPUs={CPUS_PER_NODE} State=UNKNOWN")
    lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


# -- the daemons -------------------------------------------------------------------------------------------------------
def _start_daemons(cluster: SlurmCluster) -> None:
    """munged, then slurmctld, then the slurmds: each daemonizes itself and writes its PID file."""
    f = cluster.folder
    _in_namespace(
        cluster.namespace,
        None,  # (munged names its origin by the hostname: the machine's, which resolves)
        [
            "munged",
            f"--socket={f}/run/munge.socket",
            f"--key-file={f}/munge/munge.key",
            f"--pid-file={f}/run/munged.pid",
            f"--log-file={f}/log/munged.log",
            f"--seed-file={f}/munge/munged.seed",
        ],
    )
    _in_namespace(cluster.namespace, "ctl", ["slurmctld", "-f", cluster.conf])
    for name in cluster.nodes:
        (Path(f) / "spool" / name).mkdir(exist_ok=True)
        _in_namespace(cluster.node_namespaces[name], name, ["slurmd", "-f", cluster.conf])


def _in_namespace(namespace: str, hostname: str | None, command: list[str]) -> None:
    """Run a daemon that forks itself away, in ``namespace``; with a ``hostname``, in a UTS namespace too, whose
    hostname is that (slurmd finds its NodeName by it; slurmctld checks it against SlurmctldHost)."""
    argv = ["ip", "netns", "exec", namespace, *command]
    if hostname is not None:
        argv[4:4] = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} did not start ({done.returncode}): {done.stdout}{done.stderr}")


def _wait_until_idle(cluster: SlurmCluster, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = cluster.states()
        if set(states) == set(cluster.nodes) and all(s == "idle" for s in states.values()):
            return
        time.sleep(0.5)
    logs = "\n".join(f"{p.name}:\n{p.read_text(errors='replace')[-1500:]}" for p in Path(cluster.folder).glob("log/*"))
    raise RuntimeError(f"the SLURM nodes are not idle after {timeout:.0f} s: {states}\n{logs}")


def _pid_of(pid_file: Path, name: str) -> int | None:
    """The PID in ``pid_file`` if that process still runs and is ``name`` (not a PID used again since)."""
    try:
        pid = int(pid_file.read_text(encoding="ascii").strip())
        return pid if Path(f"/proc/{pid}/comm").read_text(encoding="ascii").strip() == name else None
    except (OSError, ValueError):
        return None


def _end(pid: int | None, *, grace: float = 15) -> None:
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM if grace else signal.SIGKILL)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _running(pid):
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Not ended, and not a zombie either (a daemon's parent is PID 1, which may never reap it, in a container)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _namespace_pids(namespace: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, check=False)
    return [int(p) for p in done.stdout.split()]


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


if __name__ == "__main__":  # .ci/run: one cluster for the whole test run
    if len(sys.argv) != 3 or sys.argv[1] not in ("start", "stop"):
        sys.exit("usage: python tests/slurm_cluster.py start|stop FOLDER")
    if sys.argv[1] == "start":
        print(json.dumps(asdict(start(sys.argv[2]))))
    else:
        stop(sys.argv[2])
