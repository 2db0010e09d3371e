"""Asking SLURM for a pool's nodes, from outside an allocation (``SlurmPool(nodes=...)``), and giving them back.

How: one job of all the nodes, as ``salloc`` makes it, whose command is a small watcher run on this machine (not on
a node): it prints the job's environment (``SLURM_JOB_ID``, ``SLURM_JOB_NODELIST``, ``SLURM_JOB_CPUS_PER_NODE``...,
exactly what a script inside ``salloc`` reads), then waits for the executor's process to end. From there on the
pool is the one inside an allocation: a host per node is a step (``srun --jobid``), a node a deadline does not need
leaves the job by a shrink (:mod:`optuna_saturn.pools.slurm_job`).

Why this shape:

- **One job, not one per node**: SLURM starts all the nodes together (the planner plans on all of them from the
  first trial), there is one job to end, and a node still goes back on its own (a shrink).
- **``salloc``, not ``sbatch``**: a batch job's script runs on its first node, which SLURM then never lets the job
  give back; an interactive allocation has no such node. Its command runs here, so ``salloc`` holds the allocation
  only while the watcher runs, and the watcher only while the executor does: a killed executor (even ``kill -9``)
  leaves no job running to its time limit.
- **Plain SLURM commands** (``salloc``, ``squeue``, ``scancel``), no library: submitit submits batch jobs (one
  function per job; no steps of our own, no shrink), and pyslurm must be built against the cluster's own SLURM
  version; the commands are on every SLURM machine, and speak each version's protocol.

The job ends when the pool closes (``scancel``, then the ``salloc`` is ended: in a ``finally``, so on an error or a
Ctrl-C too), and if the executor dies first, with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

import optuna

_logger = optuna.logging.get_logger("optuna.saturn")

#: Seconds between two progress lines while SLURM has not started the job.
PROGRESS_SECONDS = 10.0
#: The watcher ``salloc`` runs: the job's environment and its own pid as one JSON line, then it waits for the
#: executor (``argv[1]``) to end.
_WATCHER = (
    "import json, os, sys, time\n"
    "env = {k: v for k, v in os.environ.items() if k.startswith('SLURM_')}\n"
    "print(json.dumps({**env, 'watcher': os.getpid()}), flush=True)\n"
    "while True:\n"
    "    try:\n"
    "        os.kill(int(sys.argv[1]), 0)\n"
    "    except ProcessLookupError:\n"
    "        break\n"
    "    time.sleep(1)\n"
)
_JOB_ID = re.compile(r"(?:job allocation|job) (\d+)")


class SlurmRequest:
    """One SLURM job of ``nodes`` nodes for a pool; see the module's docstring. ``start`` waits for it and returns
    its environment; ``end`` ends it (and may be called again)."""

    def __init__(
        self,
        *,
        nodes: int,
        partition: str | None = None,
        time_limit: str | None = None,
        gpus_per_node: int | None = None,
        cpus_per_node: int | None = None,
        salloc_options: Sequence[str] = (),
        start_timeout: float | None = None,
    ) -> None:
        self.nodes = nodes
        self.partition = partition
        self.time_limit = time_limit
        self.gpus_per_node = gpus_per_node
        self.cpus_per_node = cpus_per_node
        self.salloc_options = tuple(salloc_options)
        self.start_timeout = start_timeout
        self.job_id: str | None = None
        self._salloc: subprocess.Popen | None = None
        self._watcher: int | None = None  # (salloc runs it in a process group of its own)
        self._said: list[str] = []  # what salloc wrote on its stderr
        self.env: dict[str, str] = {}  # the running job's environment (start's answer)

    def command(self, nodelist: Sequence[str] = ()) -> list[str]:
        """The ``salloc`` that asks for the job (``nodelist``: exactly those nodes, as a pool asks again)."""
        cpus = ["--exclusive"] if self.cpus_per_node is None else [f"--cpus-per-task={self.cpus_per_node}"]
        return [
            "salloc",
            f"--nodes={self.nodes}",
            "--ntasks-per-node=1",
            *cpus,
            *([f"--partition={self.partition}"] if self.partition else []),
            *([f"--time={self.time_limit}"] if self.time_limit else []),
            *([f"--gpus-per-node={self.gpus_per_node}"] if self.gpus_per_node else []),
            *([f"--nodelist={','.join(nodelist)}"] if nodelist else []),
            "--no-kill",  # (a node lost does not end the job: the pool runs its trials on the others)
            "--job-name=optuna-saturn",
            *self.salloc_options,
            sys.executable,
            "-c",
            _WATCHER,
            str(os.getpid()),
        ]

    def running(self) -> bool:
        return self._salloc is not None and self._salloc.poll() is None

    def start(self, nodelist: Sequence[str] = ()) -> dict[str, str]:
        """Ask for the job and wait until it runs, saying why it waits; its environment, as a script inside it sees
        it. Raises with SLURM's own words where it refuses the job (nothing is left queued)."""
        if self.running():
            self.end()  # (never two jobs at once: the first would be out of reach)
        command = self.command(nodelist)
        self._said = []
        self.job_id = None
        try:
            self._salloc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,  # (a Ctrl-C is the executor's: it ends the job itself)
            )
        except FileNotFoundError as exc:
            raise RuntimeError("SlurmPool(nodes=...) needs SLURM's commands (salloc, srun) on the PATH.") from exc
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=_lines, args=(self._salloc.stdout, lines.put), daemon=True).start()
        threading.Thread(target=_lines, args=(self._salloc.stderr, self._heard), daemon=True).start()
        try:
            return self._wait(lines, command)
        except BaseException:
            self.end()
            raise

    def _heard(self, line: str) -> None:
        self._said.append(line)
        if self.job_id is None and (found := _JOB_ID.search(line)):
            self.job_id = found[1]

    def _wait(self, lines: queue.Queue[str], command: list[str]) -> dict[str, str]:
        assert self._salloc is not None
        started = time.monotonic()
        told = started
        while True:
            try:
                env: dict[str, str] = json.loads(lines.get(timeout=0.5))
                self._watcher, self.job_id = int(env.pop("watcher")), env["SLURM_JOB_ID"]
                self.env = env
                _logger.info(f"SLURM started job {self.job_id} on {env.get('SLURM_JOB_NODELIST')}.")
                return env
            except queue.Empty:
                pass
            if self._salloc.poll() is not None:
                time.sleep(0.2)  # (the last of its stderr)
                said = "\n".join(self._said[-6:]) or f"salloc exited with code {self._salloc.returncode}"
                raise RuntimeError(
                    f"SLURM did not start the pool's job ({' '.join(command[: command.index(sys.executable)])}):\n"
                    f"{said}\nFix SlurmPool's options (sinfo lists the partitions and their nodes)."
                )
            waited = time.monotonic() - started
            if self.start_timeout is not None and waited > self.start_timeout:
                raise TimeoutError(
                    f"SLURM did not start job {self.job_id} in {self.start_timeout:.0f} s ({self.state()}); it is "
                    "cancelled. Ask for fewer or smaller nodes, or raise SlurmPool(start_timeout=...)."
                )
            if time.monotonic() - told >= PROGRESS_SECONDS and self.job_id is not None:
                told = time.monotonic()
                _logger.info(f"waiting for SLURM to start job {self.job_id}: {self.state()} ({waited:.0f} s so far)")

    def state(self) -> str:
        """The job's state and SLURM's reason, as ``squeue`` says them: ``PENDING (Resources)``."""
        done = subprocess.run(
            ["squeue", "--noheader", f"--jobs={self.job_id}", "--format=%T %r"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        state, _, reason = done.stdout.strip().partition(" ")
        return f"{state} ({reason})" if state else "not in squeue"

    def end(self) -> None:
        """Cancel the job and end the ``salloc`` that holds it. An ``scancel`` that fails or times out is a warning,
        not an error (it runs from a ``finally``: it must not hide the sweep's own error), and ``salloc`` is ended
        all the same, which ends the job too."""
        try:
            if self.job_id is not None:
                subprocess.run(["scancel", self.job_id], capture_output=True, timeout=60, check=False)
        except (subprocess.SubprocessError, OSError) as exc:
            _logger.warning(f"scancel {self.job_id} failed ({exc}); ending its salloc ends the job instead.")
        finally:
            self._end_salloc()

    def _end_salloc(self) -> None:
        salloc, self._salloc = self._salloc, None
        if salloc is not None and salloc.poll() is None:
            for pid in filter(None, (self._watcher, salloc.pid)):  # (salloc waits for its command, whatever it gets)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            try:
                salloc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                salloc.kill()
                salloc.wait()
        self._watcher = None


def _lines(stream, put) -> None:  # type: ignore[no-untyped-def]
    for line in stream:
        put(line.rstrip("\n"))
