"""The pool of real processes: what a real sweep runs its jobs on.

It puts three mechanisms behind the one pool protocol, so that the sweep's loop never asks which one runs a job:

- a warm backend (:class:`~optuna_saturn.pools.warm_backend.WarmBackend`): warm workers, one per device, on this
  machine (:class:`~optuna_saturn.pools.warm.WorkerPool`) or on a Ray cluster's nodes
  (:class:`~optuna_saturn.pools.ray.RayWorkers`), for every strategy they can stand in for;
- a launcher's process tree per job, for strategies whose launcher must own the processes
  (:class:`~optuna_saturn.pools.launched.LaunchedJobs`);
- the private channel (:class:`~optuna_saturn.channel.ChannelServer`) over which each job's rank 0 talks to its
  trial's session: registered when the job is submitted, dropped when it ends;
- the describer (:class:`~optuna_saturn.pools.describing.Describer`), the process that runs the objective to
  describe a trial before it is planned: the executor's own process never runs it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import optuna

from optuna_saturn.channel import ChannelServer
from optuna_saturn.devices import Device
from optuna_saturn.pools.describing import Describer
from optuna_saturn.pools.launched import LaunchedJobs, owns_its_processes
from optuna_saturn.pools.protocol import JobEnd, JobRequest, PoolBroken
from optuna_saturn.pools.warm_backend import WarmBackend
from optuna_saturn.profiler import Workload
from optuna_saturn.study.folders import safe
from optuna_saturn.training import checkpoint
from optuna_saturn.worker.failures import first_failure
from optuna_saturn.worker.objective_recipe import describe_objective

#: How often a launcher's exit is looked for while launched jobs run (they say nothing over a pool's channel).
_LAUNCHED_POLL_SECONDS = 0.05


class ProcessPool:
    """Runs jobs as processes; see the module's docstring. The executor builds its warm backend, and the launched
    jobs' runner where some strategy's launcher must own its processes (None: no strategy's does)."""

    def __init__(
        self,
        objective: Callable[..., Any],
        *,
        warm: WarmBackend,
        launched: LaunchedJobs | None = None,
        describer: Describer | None = None,
    ) -> None:
        self._objective = objective
        self._warm = warm
        self._launched = launched
        self._describer = describer
        self._started = False
        self._server: ChannelServer | None = None
        self._recipe: dict = {}
        self._tokens: dict[str, list[str]] = {}  # job -> the tokens of its trials' sessions on the channel
        self._errors: dict[str, str] = {}  # job -> where its ranks leave their errors
        self._stopped: list[JobEnd] = []  # launched jobs stopped, not reported yet
        #: Called about every 0.25 s while a trial is described (by the sweep's thread, which waits for the
        #: description): the sweep starts the trials planned on workers that came up meanwhile.
        self.while_describing: Callable[[], None] = lambda: None

    def node_of(self, device: Device) -> dict[str, Any]:
        return self._warm.node_of(device)

    @property
    def shares_checkpoints(self) -> bool:
        return self._warm.shares_checkpoints

    checkpoints_on_disk = True

    def has_checkpoint(self, path: str) -> bool:
        return checkpoint.exists_at(path)

    def start(self) -> None:
        self._server = ChannelServer(host=self._warm.channel_host)
        self._recipe = describe_objective(self._objective, self._server.folder)
        self._started = True
        if self._describer is not None:
            self._describer.start(self._server, self._recipe)
        self._warm.start(self._server, preload=self._recipe)

    def describe(self, trial: Any, *, lock: threading.Lock, study: optuna.Study | None = None) -> Workload:
        """``trial``'s workload, described in the describer (see :meth:`Describer.describe`), while the workers
        start or run."""
        if self._describer is None or not self._started:
            raise RuntimeError("this pool has no describer, or is not started")
        return self._describer.describe(trial, lock=lock, study=study, still_up=self._meanwhile)

    def _meanwhile(self) -> None:
        self._still_up()
        self.while_describing()

    def _still_up(self) -> None:
        problem = self._warm.host_problem()
        if problem:
            raise PoolBroken(problem)

    def ready(self) -> set[int]:
        return self._warm.ready() if self._started else set()

    def joined(self) -> list[Device]:
        return self._warm.joined() if self._started else []

    def lost(self) -> set[int]:
        return self._warm.lost() if self._started else set()

    def release(self, devices: set[int]) -> set[int]:
        return self._warm.release(devices) if self._started else set()

    @property
    def _channel(self) -> ChannelServer:
        """The channel server, from the start to the close."""
        if self._server is None:
            raise RuntimeError("the process pool is not started, or was closed")
        return self._server

    def submit(self, job: JobRequest) -> None:
        specs = []
        server = self._channel
        errors = os.path.join(server.folder, safe(job.key))
        self._errors[job.key] = errors
        for task in job.tasks:
            token = server.register(task.session.handle)
            self._tokens.setdefault(job.key, []).append(token)
            specs.append(
                {
                    "channel": server.address,
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
        if self._launched is not None and owns_its_processes(job.strategy):
            self._launched.submit(job.key, spec, job.devices, job.strategy, log=job.log)
        else:
            self._warm.submit(job.key, spec, job.devices, log=job.log)

    def wait(self, timeout: float) -> list[JobEnd]:
        launched = self._launched
        if launched is not None and launched.busy:
            timeout = min(timeout, _LAUNCHED_POLL_SECONDS)
        ends = self._warm.wait(timeout) + (launched.poll() if launched is not None else []) + self._stopped
        self._stopped = []
        problem = self._warm.host_problem()
        if problem:
            raise PoolBroken(problem)
        return [self._ended(end) for end in ends]

    def stop(self, key: str, reason: str) -> None:
        if self._launched is not None and self._launched.owns(key):
            end = self._launched.stop(key)
            if end is not None:
                self._stopped.append(JobEnd(end.key, end.devices, False, reason))
        elif self._started:
            self._warm.stop(key, reason=reason)

    def close(self) -> None:
        """Stop everything (again: a sweep that stops early closes its pool, and then closes it at the end)."""
        if self._started:
            if self._describer is not None:
                self._describer.close()
            self._warm.close()
            self._started = False
        if self._launched is not None:
            self._launched.close()
        if self._server is not None:
            self._server.close()
            self._server = None

    def _ended(self, end: JobEnd) -> JobEnd:
        """``end`` with the failure of its rank that failed first; its trials' tokens no longer open the channel."""
        for token in self._tokens.pop(end.key, []):
            self._channel.unregister(token)
        errors = self._errors.pop(end.key, None)
        failure = first_failure(errors) if errors is not None else None
        return JobEnd(end.key, end.devices, end.clean, end.reason, str(failure) if failure else None, failure)
