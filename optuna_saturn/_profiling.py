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
    """One short real launch: ``trial``'s objective timed under each of ``strategies`` (same launcher, same
    device count) in turn, so the launch is paid once for all of them."""

    trial: optuna.Trial
    strategies: tuple[Strategy, ...]
    keys: tuple[str, ...]
    devices: int
    workload: Workload

    @property
    def name(self) -> str:
        return "+".join(s.name for s in self.strategies) + f"x{self.devices}"


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
        """Dry-run each trial; return the launches that measure every uncached, possibly-feasible key once.

        Keys shared by several trials (they differ only in, say, learning rate) are measured once. Strategies
        of one launcher and device count share a launch, least memory first (so an out-of-memory run stops
        before the strategies that would need even more).
        """
        seen: set[str] = set()
        groups: dict[tuple[int, int, str], list[tuple[Strategy, str]]] = {}
        workloads: dict[int, Workload] = {}
        for trial in trials:
            workload = self._probe(trial)
            self._workloads[trial.number] = workload
            if workload is None:
                continue
            for strategy, devices in self._candidates(workload):
                key = self._key(workload, strategy, devices)
                if key in seen or self._store.get(key) is not None:
                    continue
                seen.add(key)
                workloads[trial.number] = workload
                groups.setdefault((trial.number, devices, strategy.launcher), []).append((strategy, key))
        by_number = {t.number: t for t in trials}
        jobs = []
        for (number, devices, _), members in groups.items():
            workload = workloads[number]
            members.sort(key=lambda m: model_state_bytes(workload.n_params, workload.bytes_per_param, m[0], devices))
            jobs.append(ProfileJob(
                by_number[number], tuple(m[0] for m in members), tuple(m[1] for m in members), devices, workload
            ))
        return sorted(jobs, key=lambda j: (-j.devices, j.name))

    def record(self, job: ProfileJob, results: Sequence[dict], launched_at: float) -> list[ProfileRecord | None]:
        """Store what a launch measured, one record per strategy it reached (None: it failed otherwise).

        Each strategy's start-up is the launch's own (process start to the first objective call) plus that
        strategy's set-up (objective call to first step), as if it had been launched alone.
        """
        by_name = {r.get("strategy"): r for r in results}
        first = results[0] if results else {}
        launch_overhead = max(0.0, first.get("objective_started_at", launched_at) - launched_at)
        records = []
        for strategy, key in zip(job.strategies, job.keys):
            outcome = by_name.get(strategy.name)
            common = {"key": key, "strategy": strategy.name, "devices": job.devices, "hardware": self._hardware,
                      "n_params": job.workload.n_params, "batch_signature": job.workload.batch_signature}
            if outcome is None:
                records.append(None)
                continue
            if outcome.get("oom"):
                record = ProfileRecord(**common, feasible=False, error=outcome.get("error", "out of memory"))
            else:
                steps = sorted(outcome["step_seconds"])
                record = ProfileRecord(
                    **common, feasible=True, step_seconds=steps[len(steps) // 2],
                    startup_seconds=launch_overhead + outcome["first_step_at"] - outcome["objective_started_at"],
                    peak_memory_bytes=int(outcome.get("peak_memory_bytes") or 0), timed_steps=len(steps),
                )
            self._store.put(record)
            records.append(record)
        return records

    @staticmethod
    def unfinished(job: ProfileJob, records: Sequence[ProfileRecord | None]) -> ProfileJob | None:
        """After an out-of-memory stop, the strategies the launch did not reach, as a new launch."""
        if not any(r is not None and not r.feasible for r in records):
            return None
        rest = [(s, k) for s, k, r in zip(job.strategies, job.keys, records) if r is None]
        if not rest:
            return None
        return ProfileJob(job.trial, tuple(s for s, _ in rest), tuple(k for _, k in rest), job.devices, job.workload)

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
