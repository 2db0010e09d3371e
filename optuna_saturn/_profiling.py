"""Profiling one batch of trials: which (workload, strategy, device count) still needs a measurement, and the
options each trial gets once measurements are in.

Trials are described by a dry run (:func:`~optuna_saturn.profiler.probe_workload`), so the profile cache is
consulted before anything is launched; trials that differ only in learning rate share every measurement.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import optuna

from optuna_saturn.devices import Device
from optuna_saturn.estimates import RuntimeEstimator
from optuna_saturn.planner import Option
from optuna_saturn.profiler import (
    ProfileRecord,
    ProfileStore,
    Workload,
    hardware_fingerprint,
    model_state_bytes,
    probe_workload,
    profile_key,
)
from optuna_saturn.profiler._hardware import device_memory_bytes
from optuna_saturn.strategy import Strategy

_logger = optuna.logging.get_logger("optuna.saturn.profiler")


@dataclass(frozen=True)
class ProfileJob:
    """One short real run to measure: ``trial``'s objective under ``strategy`` on ``devices`` devices."""

    key: str
    trial: optuna.Trial
    strategy: Strategy
    devices: int
    workload: Workload

    @property
    def name(self) -> str:
        return f"{self.strategy.name}x{self.devices}"


class BatchProfiler:
    """Decides what to measure for a batch, and turns measurements into planner options."""

    def __init__(
        self,
        *,
        objective: Callable[..., Any],
        strategies: Sequence[Strategy],
        pool: Sequence[Device],
        store: ProfileStore,
        estimator: RuntimeEstimator,
        lock: threading.Lock,
    ) -> None:
        self._objective = objective
        self._strategies = list(strategies)
        self._pool = list(pool)
        self._store = store
        self._estimator = estimator
        self._lock = lock
        self._hardware = hardware_fingerprint(pool[0])
        self._memory = device_memory_bytes(pool)
        self._workloads: dict[int, Workload | None] = {}
        self._warned_probe = False

    def plan_measurements(self, trials: Sequence[optuna.Trial]) -> list[ProfileJob]:
        """Dry-run each trial; return one job per uncached, possibly-feasible key (shared keys measured once)."""
        jobs: dict[str, ProfileJob] = {}
        for trial in trials:
            workload = self._probe(trial)
            self._workloads[trial.number] = workload
            if workload is None:
                continue
            for strategy, devices in self._candidates(workload):
                key = self._key(workload, strategy, devices)
                if key not in jobs and self._store.get(key) is None:
                    jobs[key] = ProfileJob(key, trial, strategy, devices, workload)
        return sorted(jobs.values(), key=lambda j: (-j.devices, j.strategy.name))

    def record(self, job: ProfileJob, outcome: dict | None, startup_seconds: float) -> ProfileRecord | None:
        """Store what a profiling run measured; an out-of-memory run marks the option infeasible."""
        common = {"key": job.key, "strategy": job.strategy.name, "devices": job.devices, "hardware": self._hardware,
                  "n_params": job.workload.n_params, "batch_signature": job.workload.batch_signature}
        if outcome and outcome.get("oom"):
            record = ProfileRecord(**common, feasible=False, error=outcome.get("error", "out of memory"))
        elif outcome and outcome.get("step_seconds"):
            steps = sorted(outcome["step_seconds"])
            record = ProfileRecord(
                **common, feasible=True, step_seconds=steps[len(steps) // 2], startup_seconds=startup_seconds,
                peak_memory_bytes=int(outcome.get("peak_memory_bytes") or 0), timed_steps=len(steps),
            )
        else:
            return None  # the run failed for another reason: unknown, not infeasible; the trial will tell
        self._store.put(record)
        return record

    def options_for(self, trial: optuna.Trial) -> tuple[list[Option], list[dict]]:
        """Every feasible option of the trial (not only the best per device count), with measured runtimes not yet
        corrected by the sweep's observations, and its profile summary."""
        workload = self._workloads.get(trial.number)
        if workload is None:
            return self._estimator.options(), []
        options, profiles = [], []
        for strategy, devices in self._candidates(workload):
            record = self._store.get(self._key(workload, strategy, devices))
            if record is None:  # not measured (profiling budget): scale from what was measured
                options.append(Option(strategy.name, devices, self._estimator.estimate(strategy.name, devices)))
                continue
            profiles.append({
                "strategy": record.strategy, "devices": record.devices, "feasible": record.feasible,
                "step_seconds": record.step_seconds, "startup_seconds": record.startup_seconds,
                "peak_memory_bytes": record.peak_memory_bytes, "key": record.key,
            })
            runtime = record.whole_trial_seconds(workload.total_steps)
            if runtime is not None:
                options.append(Option(strategy.name, devices, runtime))
        return options, profiles

    def _candidates(self, workload: Workload) -> list[tuple[Strategy, int]]:
        """(strategy, device count) pairs whose model state can fit at all (analytic bound, no launch)."""
        return [
            (strategy, devices)
            for strategy in self._strategies
            for devices in strategy.device_counts(len(self._pool))
            if model_state_bytes(workload.n_params, workload.bytes_per_param, strategy, devices) <= self._memory
        ]

    def _key(self, workload: Workload, strategy: Strategy, devices: int) -> str:
        return profile_key(workload.model_signature, workload.batch_signature, strategy, devices, self._hardware)

    def _probe(self, trial: optuna.Trial) -> Workload | None:
        try:
            return probe_workload(self._objective, trial, self._lock)
        except RuntimeError as exc:
            if not self._warned_probe:
                _logger.warning(
                    f"Trial {trial.number} cannot be profiled ({exc}); it is planned from runtime estimates."
                )
                self._warned_probe = True
            return None
