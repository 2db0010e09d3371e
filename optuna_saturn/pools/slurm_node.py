"""One SLURM node's warm workers: a :class:`~optuna_saturn.pools.warm.WorkerPool` whose pool host runs on that node,
started there by ``srun`` (a job step of one task on that node), instead of on this machine.

Everything else is the local pool's: the host forks a worker per device of its node
(:mod:`optuna_saturn.pools.warm_host`, through :mod:`optuna_saturn.pools.slurm_host`, which leases the node's
devices first), the workers talk to the executor over the channel with this pool's token, and a job's ranks meet
through a file rendezvous in a folder of their node. What differs is what cannot be done from here: a worker on
another node is killed by a step on its node (``srun ... kill``), and it is known dead by its connection's close (or
its replacement's hello), not by a look at this machine's processes. :meth:`SlurmNodeWorkers.lose` ends the node:
SLURM said it is down, or its host's step ended.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from optuna_saturn.pools.forked_host import ForkedHost
from optuna_saturn.pools.slurm_allocation import SlurmNode
from optuna_saturn.pools.warm import WorkerPool

#: Seconds a kill step may take before it is given up (a node that stopped answering).
KILL_STEP_SECONDS = 30


def srun(job_id: str, node: SlurmNode, command: Sequence[str], *, whole_node: bool = False) -> list[str]:
    """``srun`` of ``command`` as one task on ``node``, inside job ``job_id``, beside the job's other steps
    (``--overlap``: a step of one node otherwise waits while another step holds its CPUs). ``whole_node``: the task
    gets the node's CPUs and GPUs (the host's step, whose workers use them all)."""
    resources = [f"--cpus-per-task={node.cpus}", *([f"--gres=gpu:{node.gpus}"] if node.gpus else [])]
    return [
        "srun",
        f"--jobid={job_id}",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={node.name}",
        "--overlap",
        "--quiet",
        *(resources if whole_node else []),
        *command,
    ]


class SlurmNodeWorkers(WorkerPool):
    """The warm workers of one node of SLURM job ``job_id``; see the module's docstring."""

    def __init__(
        self, job_id: str, node: SlurmNode, *, log_dir: Path, ended: queue.Queue, host_config: dict, **common: Any
    ) -> None:
        super().__init__(node.devices, log_dir=log_dir / node.name, fork=False, **common)
        self.node = node
        self._job_id = job_id
        self._name = f"pool-{node.name}"
        self._ended = ended  # (the jobs of every node end into one queue: the sweep waits on all at once)
        self._host_extra = host_config
        self._gone: set[int] = set()  # workers whose connection closed
        self._kills: list[subprocess.Popen] = []
        self.lost_because: str | None = None

    def _start_host(self, config_path: Path, env: dict[str, str]) -> subprocess.Popen | ForkedHost:
        """The host, on the node: a step of the job that lives as long as the host does. Its config goes through
        the step's stdin (a node need not see this machine's temporary folder); it keeps a copy at the same path on
        its node, whose folder holds its jobs' rendezvous files too."""
        with open(os.open(self._host_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
            command = [sys.executable, "-m", "optuna_saturn.pools.slurm_host", str(config_path)]
            host = subprocess.Popen(
                srun(self._job_id, self.node, command, whole_node=True),
                env={**os.environ, **env},
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # (a Ctrl-C of the executor's terminal is the executor's to handle)
            )
        assert host.stdin is not None
        with host.stdin:
            host.stdin.write(config_path.read_bytes())
        return host

    def _kill(self, pid: int) -> None:
        """SIGKILL worker ``pid`` on its node: a step there, which kills it only if it still is a worker."""
        self._kills = [k for k in self._kills if k.poll() is None]
        if self.lost_because is not None:
            return  # (no step reaches a node that is gone)
        check = 'case "$(cat /proc/$0/comm 2>/dev/null)" in saturn-worker-*) kill -9 "$0";; esac'
        command = ["timeout", str(KILL_STEP_SECONDS), *srun(self._job_id, self.node, ["sh", "-c", check, str(pid)])]
        self._kills.append(
            subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )

    def _alive(self, pid: int) -> bool:
        """Whether worker ``pid`` lives, as far as can be told from here: until its connection closed, or another
        worker took its device's slot (its replacement said hello)."""
        return pid not in self._gone and any(w.pid == pid for w in self._workers)

    def _closed(self, index: int, pid: int) -> None:
        self._gone.add(pid)
        super()._closed(index, pid)

    def check_workers(self) -> None:
        """End the ranks of running jobs whose worker is known gone (see :meth:`WorkerPool.wait`)."""
        self._end_ranks_whose_worker_is_gone()

    def host_ended(self) -> str | None:
        """Why this node's host is gone (its step ended), or None while it runs."""
        return self.host_problem() if self._host is not None and self._host.poll() is not None else None

    def lose(self, reason: str) -> None:
        """The node is gone: its running jobs end unclean with ``reason``, its workers are refused from now on (on a
        node whose ``slurmd`` died they may still run: they exit at their next request), and its host's step is
        ended as far as SLURM still can."""
        if self.lost_because is not None:
            return
        self.lost_because = reason
        with self._lock:
            for job in list(self._jobs.values()):
                for device in job.unfinished():
                    self._rank_ended(job, device, False, reason)
            for worker in self._workers:
                worker.connected, worker.job = False, None
                worker.orders.put({"exit": True})
        if self._token and self._server is not None:
            self._server.unregister(self._token)
        if self._host is not None and self._host.poll() is None:
            self._host.send_signal(signal.SIGTERM)  # (srun: it tells the step, if the node still hears)

    def ready(self) -> set[int]:
        return set() if self.lost_because is not None else super().ready()

    def close(self) -> None:
        if self.lost_because is not None:
            if self._host is not None and self._host.poll() is None:
                self._host.kill()
            return
        super().close()
        for kill in self._kills:
            try:
                kill.wait(timeout=KILL_STEP_SECONDS)
            except subprocess.TimeoutExpired:
                kill.kill()
