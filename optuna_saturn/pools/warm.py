"""The device pool: warm workers, one per device, that run the sweep's jobs (trials and profiling runs).

A job on ``k`` devices runs on those devices' ``k`` workers, which form a fresh process group for it (a new file
rendezvous in the sweep's private folder, gloo bound to loopback) and tear it down after; no process starts.
Workers talk to the executor over its private channel: each asks for its next order (a job, an objective to import
ahead, or the end), then says how the job went. A worker that dies, or ends a job unclean, is replaced by the pool
host (:mod:`optuna_saturn.pools.warm_host`); the pool sees its connection close.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optuna_saturn.channel import ChannelServer
from optuna_saturn.devices import Device, available_cores, physical_gpus, pin_cores
from optuna_saturn.pools.deepspeed_ops import build_missing, needed_by
from optuna_saturn.pools.forked_host import ForkedHost, start_host, why_not_fork
from optuna_saturn.pools.launch_commands import host_environment
from optuna_saturn.pools.logs import last_unindented_line
from optuna_saturn.pools.process_identity import alive, kill_if_same, start_ticks
from optuna_saturn.pools.protocol import JobEnd, JobRanks
from optuna_saturn.pools.worker_starts import StartWatch

#: How long a job's ranks may wait for each other to join its process group.
RENDEZVOUS_TIMEOUT_SECONDS = 600.0
#: How long one collective may wait for a peer (a rank-0-only evaluation or data preparation between steps) before
#: the process group gives up on it; the executor's stall detection usually stops a hung trial first.
COLLECTIVE_TIMEOUT_SECONDS = 1800.0
#: A stopped job whose ranks have not all ended this long after the stop's grace period ends now, whatever its
#: workers say (a process the kill cannot end, a report lost): the sweep never waits for it for ever.
STOP_DEADLINE_SECONDS = 10.0
#: How often :meth:`WorkerPool.wait` looks whether the workers of running jobs are still alive.
LIVENESS_SECONDS = 0.5


@dataclass
class _Worker:
    index: int
    pid: int | None = None
    connected: bool = False
    job: Any = None  # the key of the job it runs
    orders: queue.Queue[dict] = field(default_factory=queue.Queue)


@dataclass
class _Job(JobRanks):
    rendezvous: Path
    pids: dict[int, int] = field(default_factory=dict, kw_only=True)  # device -> its worker's pid at submit
    stopped_at: float | None = field(default=None, kw_only=True)  # monotonic time of the stop, if stopped


class WorkerPool:
    """Warm workers for ``devices``; see the module's docstring. Thread-safe: the channel's threads report to it,
    the scheduler's thread submits and waits."""

    #: The channel listens on this machine's loopback.
    channel_host: str | None = None
    #: Every device is on this machine: any reads a checkpoint another wrote.
    shares_checkpoints = True
    #: Names its config and rendezvous files in the channel's folder (one per node where a pool has several).
    _name = "pool"

    def __init__(
        self,
        devices: Sequence[Device],
        *,
        isolate_network: bool = False,
        memory_limit: float | None = None,
        log_dir: Path,
        grace_period: float = 5.0,
        multi_device: bool = True,
        engines: Sequence[str] = (),
        deepspeed_configs: Sequence[dict] = (),
        one_process: bool = False,
        fork: bool = True,
        collective_timeout: float = COLLECTIVE_TIMEOUT_SECONDS,
    ) -> None:
        self.devices = list(devices)
        self._server: ChannelServer | None = None  # (given at the start)
        self._isolate = isolate_network
        self._memory_limit = memory_limit
        self._log_dir = log_dir
        self._host_log = log_dir / "pool-host.log"
        self._grace = grace_period
        self._multi_device = multi_device  # jobs may span devices: workers import what process groups need
        self._engines = sorted(engines)  # the engines jobs will use: imported once, before the workers fork
        self._deepspeed_configs = list(deepspeed_configs)  # (the ZeRO strategies': which ops to build first)
        self._fork = fork  # the host may be a fork of this process (runner._forked_host says when it is safe)
        self._one_process = one_process  # a worker may run on several devices' cores (see forked_host)
        self._collective_timeout = collective_timeout
        self._lock = threading.Lock()
        self._started: dict[int, int | None] = {}  # a worker's pid -> its start (process_identity.start_ticks)
        self._workers = [_Worker(i) for i in range(len(devices))]
        self._jobs: dict[Any, _Job] = {}
        self._ended: queue.Queue = queue.Queue()
        self._host: subprocess.Popen | ForkedHost | None = None
        self._token = ""
        self._rendezvous_ids = itertools.count()
        self._checked_at = 0.0  # when the running jobs' workers were last looked at (monotonic)
        self._starts: StartWatch | None = None  # (from the start)
        self._host_extra: dict[str, Any] = {}  # what a host started elsewhere needs besides the common config

    # -- life cycle ----------------------------------------------------------------------------------------------
    def start(self, channel: ChannelServer, preload: dict | None = None) -> None:
        """Start the host and its workers; the host imports ``preload`` (an objective recipe) before forking them."""
        self._server = channel
        self._token = channel.register(self._handle)
        self._log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._starts = StartWatch(self._log_dir, len(self.devices))
        config = {
            "devices": [d.to_json() for d in self.devices],
            "channel": self._server.address,
            "token": self._token,
            "folder": str(self._log_dir),
            "memory_limit": self._memory_limit,
            "preload": preload,
            "multi_device": self._multi_device,
            "engines": self._engines,
            "pin_cores": pin_cores(self.devices),
            "one_process": self._one_process,
            "executor_pid": os.getpid(),  # the host's parent: it dies with it
            "timeouts": {"collective": self._collective_timeout},
            **self._host_extra,
        }
        if self.devices[0].kind == "cuda":  # worker i sees the i-th only (optuna_saturn.worker.gpu)
            config["gpus"] = physical_gpus(self.devices)
            config["gpu_threads"] = max(1, len(available_cores()) // len(self.devices))
        config_path = Path(channel.folder) / f"{self._name}.json"
        config_path.write_text(json.dumps(config), encoding="utf-8")
        os.chmod(config_path, 0o600)
        env = host_environment(self.devices[0].kind, self._log_dir)
        if needed_by(self._engines):  # before any timed or watched run: see deepspeed_ops
            build_missing(
                self.devices[0].kind, env, log=self._log_dir / "deepspeed-ops.log", configs=self._deepspeed_configs
            )
        self._host = self._start_host(config_path, env)

    def _start_host(self, config_path: Path, env: dict[str, str]) -> subprocess.Popen | ForkedHost:
        """The pool host, on this machine (a cluster's node starts its own: see :mod:`optuna_saturn.pools.slurm`)."""
        why_not = None if self._fork else "forking the executor was turned off"
        return start_host(
            "optuna_saturn.pools.warm_host",
            str(config_path),
            env=env,
            log=self._host_log,
            isolate=self._isolate,
            why_not_fork=why_not or why_not_fork(self.devices, one_process=self._one_process),
        )

    def close(self) -> None:
        """Stop every worker and the host."""
        with self._lock:
            for worker in self._workers:
                worker.orders.put({"exit": True})
        if self._host is not None and self._host.poll() is None:
            self._host.send_signal(signal.SIGTERM)
            try:
                self._host.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._host.kill()
                self._host.wait()
        with self._lock:
            pids = [w.pid for w in self._workers if w.pid]
        for pid in pids:  # a worker the host did not reach (it died first)
            self._kill(pid)
        if self._token and self._server is not None:
            self._server.unregister(self._token)

    # -- jobs -----------------------------------------------------------------------------------------------------
    def ready(self) -> set[int]:
        """Devices whose worker is up and idle."""
        with self._lock:
            return {w.index for w in self._workers if w.connected and w.job is None}

    def joined(self) -> list[Device]:
        """Devices added since the last call: none on one machine."""
        return []

    def lost(self) -> set[int]:
        """Devices that can no longer run jobs: those whose worker cannot start (a dead worker is replaced)."""
        with self._lock:
            return set() if self._starts is None else set(self._starts.lost())

    def node_of(self, device: Device) -> dict[str, Any]:
        return {}

    def release(self, devices: set[int]) -> set[int]:
        """None: this machine's devices are not rented one by one (an idle worker holds only its memory)."""
        return set()

    def starting(self) -> set[int]:
        """Devices whose worker is not up yet (the pool is starting, or a worker is being replaced)."""
        with self._lock:
            return {w.index for w in self._workers if not w.connected}

    def host_problem(self) -> str | None:
        """Why the pool cannot run jobs any more, if it cannot: no device's worker could start, or its host died."""
        if self._starts is not None and len(self._starts.lost()) == len(self.devices):
            return self._starts.why_none_started()  # (the host ends once it gave up on every worker: this first)
        if self._host is not None and self._host.poll() is not None:
            said = last_unindented_line(self._host_log)
            said = said if len(said) <= 300 else said[:300] + "..."
            return (
                f"the worker pool's host exited with code {self._host.returncode}"
                + (f"; its log ends: {said}" if said else "")
                + f" (the whole log: {self._host_log})"
            )
        return None

    def submit(self, key: Any, job: dict, devices: Sequence[int], *, log: Path) -> None:
        """Run ``job`` (a spec for :func:`optuna_saturn.worker.rank.run_job`) on ``devices``, whose workers must be
        ready. Its end comes out of :meth:`wait`."""
        log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self._server is None:
            raise RuntimeError(f"job {key!r} submitted to a worker pool that was not started")
        rendezvous = Path(self._server.folder) / f"{self._name}-rendezvous-{next(self._rendezvous_ids)}"
        with self._lock:
            workers = [self._workers[d] for d in devices]
            if any(not w.connected or w.job is not None for w in workers):
                raise RuntimeError(f"devices {list(devices)} are not all ready for job {key!r}")
            pids = {d: w.pid for d, w in zip(devices, workers) if w.pid is not None}  # (all: connected ones have it)
            self._jobs[key] = _Job(key, tuple(devices), rendezvous, pids=pids)
            for rank, worker in enumerate(workers):
                worker.job = key
                worker.orders.put(
                    {
                        "job": {
                            **job,
                            "name": str(key),
                            "rank": rank,
                            "world_size": len(workers),
                            "log": str(log),
                            "rendezvous": f"file://{rendezvous}",
                            "timeout": RENDEZVOUS_TIMEOUT_SECONDS,
                        }
                    }
                )

    def wait(self, timeout: float) -> list[JobEnd]:
        """Jobs that ended since the last call; waits up to ``timeout`` seconds for the first one."""
        self._end_ranks_whose_worker_is_gone()
        ended = []
        try:
            ended.append(self._ended.get(timeout=timeout))
            while True:
                ended.append(self._ended.get_nowait())
        except queue.Empty:
            pass
        return ended

    def stop(self, key: Any, reason: str = "stopped") -> None:
        """Stop a job: its workers are killed (and replaced); its end comes out of :meth:`wait`. A rank whose
        worker is already gone ends at once (nothing else would end it); one that does not end in time ends
        anyway (:data:`STOP_DEADLINE_SECONDS`)."""
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                return
            job.reason = job.reason or reason
            job.stopped_at = job.stopped_at or time.monotonic()
            pids = [job.pids.get(d) for d in job.unfinished()]
        for pid in pids:
            if pid:
                self._kill(pid)
        self._end_ranks_whose_worker_is_gone()

    def _end_ranks_whose_worker_is_gone(self) -> None:
        """End every rank of a running job whose worker (the process it was given to) no longer runs it: it died,
        and its death was not heard (a connection's close can come before the process is seen to be gone, or
        after its replacement said hello), or it was stopped and did not end in time."""
        now = time.monotonic()
        if now - self._checked_at < LIVENESS_SECONDS and not any(j.stopped_at for j in self._jobs.values()):
            return
        self._checked_at = now
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            overdue = job.stopped_at is not None and now - job.stopped_at > self._grace + STOP_DEADLINE_SECONDS
            for device in job.unfinished():
                pid = job.pids.get(device)
                if overdue or pid is None or not self._alive(pid):
                    why = (
                        f"the rank on device {device} did not end {self._grace + STOP_DEADLINE_SECONDS:.0f} s "
                        "after it was stopped"
                        if overdue
                        else f"the worker of device {device} died"
                    )
                    self._rank_gone(job, device, why)

    def _rank_gone(self, job: _Job, device: int, reason: str) -> None:
        """``job``'s rank on ``device`` ended unclean, its worker gone; the slot keeps whatever worker holds it."""
        with self._lock:
            if self._jobs.get(job.key) is not job or device in job.finished:
                return
            worker = self._workers[device]
            if worker.job == job.key and worker.pid == job.pids.get(device):
                worker.job, worker.connected = None, False
            self._rank_ended(job, device, False, reason)

    # -- what the workers say (channel threads) -------------------------------------------------------------------
    def _handle(self, op: str, message: dict) -> Any:
        index = int(message.get("worker", -1))
        if op == "hello":
            pid = int(message["pid"])
            with self._lock:
                worker = self._workers[index]
                # a replacement: the rank its predecessor ran ended with it, even if its close is not heard yet
                previous = self._jobs.get(worker.job) if worker.pid != pid else None
                if previous is not None and index not in previous.finished:
                    self._rank_ended(previous, index, False, f"the worker of device {index} died")
                worker.pid, worker.connected, worker.job = pid, True, None
                if self._starts is not None:
                    self._starts.up(index)
                self._started[pid] = start_ticks(pid)  # (its pid is killed only while it still names it)
                worker.orders = queue.Queue()
            return {"worker": index}
        if op == "next":
            return self._next_order(self._workers[index])
        if op == "done":
            self._finished(
                index,
                bool(message.get("clean")),
                "" if message.get("clean") else "a rank failed",
                still_up=not message.get("recycle"),
            )
            return None
        if op == "closed":
            self._closed(index, int(message.get("pid", -1)))
            return None
        raise ValueError(f"Unknown request {op!r} from a pool worker.")

    def _next_order(self, worker: _Worker) -> dict:
        pid = worker.pid
        while True:
            try:
                return worker.orders.get(timeout=1.0)
            except queue.Empty:
                if pid is None or not self._alive(pid):  # it died while idle: end this request (the connection closes)
                    return {"exit": True}

    def _kill(self, pid: int) -> None:
        kill_if_same(pid, self._started.get(pid))

    _alive = staticmethod(alive)  # (whether a worker of this pool's lives: one of this machine, here)

    def _closed(self, index: int, pid: int) -> None:
        """The connection of worker ``pid`` (device ``index``, as its hello said) closed: it exited or died. If it
        still holds its slot, the slot is down until its replacement says hello, and the rank it ran ended."""
        with self._lock:
            if not 0 <= index < len(self._workers) or self._workers[index].pid != pid:
                return  # its replacement said hello first, and ended the rank it ran then
        self._finished(index, False, f"the worker of device {index} died", still_up=False)

    def _finished(self, index: int, clean: bool, reason: str, *, still_up: bool) -> None:
        with self._lock:
            worker = self._workers[index]
            worker.connected = worker.connected and still_up
            if not still_up and self._starts is not None:
                self._starts.down(index)
            key, worker.job = worker.job, None
            job = self._jobs.get(key)
            if job is not None and index not in job.finished:
                self._rank_ended(job, index, clean, reason)

    def _rank_ended(self, job: _Job, index: int, clean: bool, reason: str) -> None:
        """(Under the lock.) One rank of ``job`` ended; the job ends once all have."""
        job.rank_ended(index, clean, reason)
        if not clean and job.unfinished():
            # Its peers may wait forever in a collective with it: stop those that do not finish soon (most fail
            # alike and report in time; rank 0 may still be sending the trial's outcome). The timer holds this
            # job, not its key: a run submitted again under the same key is not its business.
            timer = threading.Timer(self._grace, self._stop_unfinished, args=(job,))
            timer.daemon, timer.name = True, "saturn-grace"
            timer.start()
        end = job.end()
        if end is not None:
            del self._jobs[job.key]
            job.rendezvous.unlink(missing_ok=True)
            self._ended.put(end)

    def _stop_unfinished(self, job: _Job) -> None:
        with self._lock:
            if self._jobs.get(job.key) is not job:
                return
            job.stopped_at = job.stopped_at or time.monotonic()
            pids = [job.pids[d] for d in job.unfinished() if job.pids.get(d)]
        for pid in pids:
            self._kill(pid)
