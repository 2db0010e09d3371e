"""A real sweep with ``SlurmPool`` inside a SLURM allocation of the test cluster (``tests/slurm_cluster.py``), for
``tests/test_slurm_pool.py``. Run it as the user would, inside the allocation, in the controller's namespace:
``salloc -N2 --exclusive --no-kill python tests/slurm_pool_sweep.py MODE OUT.json [EXTRA_JSON]``, MODE ``spread``
(8 trials over both nodes' 2 CPU devices, single and DDP), ``node-death`` (the ``slurmd`` of the node a trial
runs on is killed, ``kill -9``, once that trial has started: EXTRA_JSON gives the pid files' folder) or ``release``
(3 trials on a device per node under a deadline of an hour: one node suffices; ``sinfo`` is watched while the sweep
runs). MODE ``time-limit`` runs 6 trials of 5 minutes (``SATURN_TEST_SLEEPY_STEPS=3000``) on the SQLite
storage EXTRA_JSON names (``storage``), in ``sbatch --time=1``: SLURM stops it mid-trial, and the test reads the
storage after. MODE ``outside`` runs without ``salloc``: ``SlurmPool(nodes=2, ...)`` asks SLURM for the nodes
itself, and the example's GPT-2 (``examples/gpt2_sweep.py``) runs 4 trials on them. Writes what the test checks as
JSON."""

from __future__ import annotations

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
sys.path[:0] = [HERE, os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "examples")]

import objectives  # noqa: E402
import optuna  # noqa: E402
import torch  # noqa: E402

from optuna_saturn import SaturnExecutor  # noqa: E402
from optuna_saturn.events import SweepListener, TrialStart  # noqa: E402
from optuna_saturn.pools.slurm_kind import SlurmPool  # noqa: E402


class KillSlurmdWhenATrialRunsThere(SweepListener):
    """Once the first trial on ``node`` runs, ``kill -9`` that node's ``slurmd`` (its pid file in ``run``)."""

    def __init__(self, node: str, run: str) -> None:
        self._node, self._run = node, run
        self.victim: int | None = None
        self.killed_at: float | None = None

    def on_trial_start(self, study: optuna.Study, start: TrialStart) -> None:
        if self.victim is None and any(d.startswith(self._node + "/") for d in start.devices):
            self.victim = start.number
            threading.Thread(target=self._kill, daemon=True).start()

    def _kill(self) -> None:
        time.sleep(1.0)  # (well inside the trial: it runs for several seconds)
        pid = int(Path(self._run, f"slurmd-{self._node}.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        self.killed_at = time.time()


class WatchNodeStates:
    """``sinfo``'s state of each node, every 0.25 s, with the time, in a thread, until stopped."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, dict[str, str]]] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(0.25):
            done = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%N %t"], capture_output=True, text=True)
            self.seen.append((time.time(), dict(line.split() for line in done.stdout.splitlines() if line.strip())))

    def stop(self) -> list[tuple[float, dict[str, str]]]:
        self._stopped.set()
        self._thread.join()
        return self.seen


def slow_on_node1(trial) -> float:
    """``sleepy``, long on node1 (35 s: past the time SLURM takes to call a node without its ``slurmd`` DOWN, about
    18 s on the test cluster, and the pool's next look) and short elsewhere (3 s). Its worker knows its node from
    ``srun``'s environment."""
    os.environ["SATURN_TEST_SLEEPY_STEPS"] = "350" if os.environ.get("SLURMD_NODENAME") == "node1" else "30"
    trial.set_user_attr("ran_on", os.environ.get("SLURMD_NODENAME"))
    return objectives.sleepy(trial)


def train_linear_on_its_node(trial) -> float:
    """``train_linear``, and the node each rank ran on, as ``srun`` told its worker."""
    value = objectives.train_linear(trial)
    nodes = [os.environ.get("SLURMD_NODENAME")] * trial.world_size
    if trial.world_size > 1:
        torch.distributed.all_gather_object(nodes, os.environ.get("SLURMD_NODENAME"))
    trial.set_user_attr("nodes_of_ranks", nodes)
    return value


def main(mode: str, out: str, run: str | None = None, partition: str = "debug", storage: str | None = None) -> None:
    started = time.time()
    tmp = tempfile.mkdtemp(prefix="saturn-slurm-test-")
    storage = storage or f"sqlite:///{tmp}/study.db"
    study = optuna.create_study(storage=storage, study_name=mode)
    listeners: list[SweepListener] = []
    if mode == "node-death":
        assert run is not None
        killer = KillSlurmdWhenATrialRunsThere("node1", run)
        listeners.append(killer)
    watch = WatchNodeStates() if mode == "release" else None
    outside = mode == "outside"
    if outside:
        import gpt2_sweep

        gpt2_sweep.token_ids()  # (the example's data, built once before its trials start)
    executor = SaturnExecutor(
        devices=2 if mode in ("spread", "outside") else 1,
        strategies=["ddp"] if mode == "spread" else ["single"],  # (ddp: every trial on 2 devices of one node)
        pool=SlurmPool(nodes=2, partition=partition, time="10:00") if outside else SlurmPool(),
        log_dir=f"{tmp}/runs",
        profile_store=f"{tmp}/profiles",
        progress="plain",
        dashboard=False,
        listeners=listeners,
        max_retries=1,
        deadline="1h" if mode == "release" else None,
    )
    import slurm_pool_sweep  # (its objective, from a module the workers import by name)

    objective = {
        "spread": slurm_pool_sweep.train_linear_on_its_node,
        "release": objectives.sleepy,
        "time-limit": objectives.sleepy,
        "outside": gpt2_sweep.objective if outside else None,
    }.get(mode, slurm_pool_sweep.slow_on_node1)
    executor.optimize(study, objective, n_trials={"spread": 8, "outside": 4, "time-limit": 6}.get(mode, 3))
    ended_at = time.time()
    queue_after = subprocess.run(["squeue", "--noheader", "--name=optuna-saturn"], capture_output=True, text=True)
    job = (
        {**study.trials[0].user_attrs, **study.trials[0].system_attrs}["saturn:node"]["slurm_job"]
        if outside
        else os.environ["SLURM_JOB_ID"]
    )
    result = {
        # (node-death: the lost node's worker runs its trial to its end, 35 s after its start, then is refused)
        "left_behind": _left_behind(job, wait=20.0 if mode in ("spread", "outside") else 45.0),
        "seconds": time.time() - started,
        "driver_pid": os.getpid(),
        "slurm_job": job,
        "queue_after": queue_after.stdout.strip(),  # (the pool's jobs, as soon as the sweep ended)
        "devices": [str(d) for d in executor.devices],
        "trials": [
            {
                "number": t.number,
                "state": t.state.name,
                "attrs": {
                    k: v for k, v in {**t.user_attrs, **t.system_attrs}.items() if not k.startswith("saturn:profil")
                },
            }
            for t in study.trials
        ],
    }
    if mode == "node-death":
        result["victim"], result["killed_at"] = killer.victim, killer.killed_at
    if watch is not None:
        result["states_seen"], result["ended_at"] = watch.stop(), ended_at
        result["summary"] = study.user_attrs["saturn:last_sweep"]
        result["job_nodelist"] = os.environ["SLURM_JOB_NODELIST"]  # (as the shrink left it, SLURM's resize script)
        plain = subprocess.run(["srun", "--overlap", "hostname"], capture_output=True, text=True, timeout=60)
        result["plain_srun"] = [plain.returncode, plain.stdout.strip(), plain.stderr.strip()]
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, default=str)


def _left_behind(job: str, wait: float = 20.0) -> list[str]:
    """The sweep's pool hosts and workers still alive on any node of SLURM job ``job`` (the test cluster's nodes share
    this machine's processes), once ``wait`` seconds passed without them all gone: a closed pool leaves none in the
    allocation, which runs on."""
    import psutil

    deadline = time.monotonic() + wait
    while True:
        found = []
        for process in psutil.process_iter(["name", "pid"]):
            try:
                name = process.info["name"]
                ours = name == "saturn-host" or name.startswith("saturn-worker-")
                if ours and process.environ().get("SLURM_JOB_ID") == job:
                    found.append(f"{process.info['name']} (pid {process.info['pid']})")
            except psutil.Error:
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


if __name__ == "__main__":
    extra = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    main(sys.argv[1], sys.argv[2], **extra)
