"""The pool of real processes: what a real sweep runs its jobs on.

It puts three mechanisms behind the one pool protocol, so that the sweep's loop never asks which one runs a job:

- warm workers, one per device, on this machine (:class:`~optuna_saturn.pools.warm.WorkerPool`) or on a Ray
  cluster's nodes (:class:`~optuna_saturn.pools.ray.RayPool`), for every strategy they can stand in for;
- a launcher's process tree per job, for strategies whose launcher must own the processes
  (:class:`~optuna_saturn.pools.launched.LaunchedJobs`);
- the private channel (:class:`~optuna_saturn.channel.ChannelServer`) over which each job's rank 0 talks to its
  trial's session: registered when the job is submitted, dropped when it ends.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from optuna_saturn import checkpoint
from optuna_saturn.channel import ChannelServer
from optuna_saturn.devices import Device
from optuna_saturn.pools.launched import LaunchedJobs, owns_its_processes
from optuna_saturn.pools.protocol import JobEnd, JobRequest, PoolBroken
from optuna_saturn.pools.ray import RayPool
from optuna_saturn.pools.ray_cluster import RayCluster
from optuna_saturn.pools.warm import WorkerPool
from optuna_saturn.strategy import Strategy
from optuna_saturn.study.folders import safe
from optuna_saturn.worker.failures import first_failure
from optuna_saturn.worker.objective_recipe import describe_objective

#: How often a launcher's exit is looked for while launched jobs run (they say nothing over a pool's channel).
_LAUNCHED_POLL_SECONDS = 0.05


class ProcessPool:
    """Runs jobs as processes; see the module's docstring."""

    def __init__(
        self,
        devices: Sequence[Device],
        objective: Callable[..., Any],
        *,
        strategies: Sequence[Strategy],
        log_dir: Path,
        isolate_network: bool = False,
        grace_period: float = 10.0,
        memory_limit: float | None = None,
        collective_timeout: float = 1800.0,
        ray: RayCluster | None = None,
    ) -> None:
        self._devices = list(devices)
        self._objective = objective
        self._strategies = list(strategies)
        self._log_dir = log_dir
        self._isolate = isolate_network
        self._grace = grace_period
        self._memory_limit = memory_limit
        self._collective_timeout = collective_timeout
        self._ray = ray
        self._server: ChannelServer | None = None
        self._warm: WorkerPool | RayPool | None = None
        self._launched = LaunchedJobs(devices, isolate_network=isolate_network, grace_period=grace_period)
        self._recipe: dict = {}
        self._tokens: dict[str, list[str]] = {}  # job -> the tokens of its trials' sessions on the channel
        self._errors: dict[str, str] = {}  # job -> where its ranks leave their errors
        self._stopped: list[JobEnd] = []  # launched jobs stopped, not reported yet

    @property
    def cluster(self) -> RayCluster | None:
        """The Ray cluster as it is now (nodes join), or None on this machine."""
        return self._warm.cluster if isinstance(self._warm, RayPool) else None

    def node_of(self, device: Device) -> dict[str, Any]:
        cluster = self.cluster  # read now: a node that joined is in it
        return {} if cluster is None else cluster.node(device.node).to_json()

    checkpoints_on_disk = True

    def has_checkpoint(self, path: str) -> bool:
        return checkpoint.exists_at(path)

    def start(self) -> None:
        self._server = ChannelServer(host=None if self._ray is None else self._ray.driver_ip)
        self._recipe = describe_objective(self._objective, self._server.folder)
        largest = max(len(n.devices) for n in self._ray.nodes) if self._ray is not None else len(self._devices)
        common = dict(
            memory_limit=self._memory_limit,
            collective_timeout=self._collective_timeout,
            log_dir=self._log_dir / "workers",
            grace_period=self._grace,
            engines={s.engine for s in self._strategies},
            multi_device=any(n > 1 for s in self._strategies for n in s.device_counts(largest)),
        )
        if self._ray is not None:
            self._warm = RayPool(self._ray, **common)
        else:
            self._warm = WorkerPool(
                self._devices,
                self._server,
                isolate_network=self._isolate,
                one_process=any(s.one_process for s in self._strategies),
                **common,
            )
        self._warm.start(preload=self._recipe)

    def ready(self) -> set[int]:
        return self._warm.ready() if self._warm is not None else set()

    def joined(self) -> list[Device]:
        joined = self._warm.joined() if self._warm is not None else []
        self._devices.extend(joined)
        return joined

    def lost(self) -> set[int]:
        return self._warm.lost() if self._warm is not None else set()

    def submit(self, job: JobRequest) -> None:
        specs = []
        errors = os.path.join(self._server.folder, safe(job.key))
        self._errors[job.key] = errors
        for task in job.tasks:
            token = self._server.register(task.session.handle)
            self._tokens.setdefault(job.key, []).append(token)
            specs.append(
                {
                    "channel": self._server.address,
                    "token": token,
                    "objective": self._recipe,
                    "trial_number": task.session.trial.number,
                    "trial": task.session.snapshot(),
                    "strategy": task.strategy.to_json(),
                    "profile": task.profile,
                    "gradient_accumulation": job.gradient_accumulation,
                    "errors": errors,
                }
            )
        spec = {**specs[0], "checkpoint": job.checkpoint}
        if job.profiling:
            spec["entries"] = specs
        if owns_its_processes(job.strategy):
            self._launched.submit(job.key, spec, job.devices, job.strategy, log=job.log)
        else:
            self._warm.submit(job.key, spec, job.devices, log=job.log)

    def wait(self, timeout: float) -> list[JobEnd]:
        if self._launched.busy:
            timeout = min(timeout, _LAUNCHED_POLL_SECONDS)
        ends = self._warm.wait(timeout) + self._launched.poll() + self._stopped
        self._stopped = []
        problem = self._warm.host_problem()
        if problem:
            raise PoolBroken(problem)
        return [self._ended(end) for end in ends]

    def stop(self, key: str, reason: str) -> None:
        if self._launched.owns(key):
            end = self._launched.stop(key)
            if end is not None:
                self._stopped.append(JobEnd(end.key, end.devices, False, reason))
        elif self._warm is not None:
            self._warm.stop(key, reason=reason)

    def close(self) -> None:
        """Stop everything (again: a sweep that stops early closes its pool, and then closes it at the end)."""
        if self._warm is not None:
            self._warm.close()
            self._warm = None
        self._launched.close()
        if self._server is not None:
            self._server.close()
            self._server = None

    def _ended(self, end: JobEnd) -> JobEnd:
        """``end`` with the failure of its rank that failed first; its trials' tokens no longer open the channel."""
        for token in self._tokens.pop(end.key, []):
            self._server.unregister(token)
        errors = self._errors.pop(end.key, None)
        failure = first_failure(errors) if errors is not None else None
        return JobEnd(end.key, end.devices, end.clean, end.reason, str(failure) if failure else None, failure)
