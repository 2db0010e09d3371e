"""Profiling one batch of trials: which (workload, strategy, device count) still needs a measurement, and the
options each trial gets once measurements are in.

Trials are described first (:func:`~optuna_saturn.profiler.probe_workload`), so the profile cache is
consulted before anything is launched; trials that differ only in learning rate share every measurement.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna

from optuna_saturn.devices import Device
from optuna_saturn.estimates import RuntimeEstimator
from optuna_saturn.planner import Option
from optuna_saturn.planner._types import option_label
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
    """One short real launch: ``trial``'s objective timed under each of ``strategies`` (same launcher, device
    count and gradient accumulation) in turn, so the launch is paid once for all of them."""

    trial: optuna.Trial
    strategies: tuple[Strategy, ...]
    keys: tuple[str, ...]
    devices: int
    workload: Workload
    gradient_accumulation: int = 1

    @property
    def name(self) -> str:
        return option_label("+".join(s.name for s in self.strategies), self.devices, self.gradient_accumulation)


@dataclass(frozen=True)
class TrialOptions:
    """What the planner may run a trial as, from its profiles (not yet corrected by the sweep's observations)."""

    options: list[Option]
    profiles: list[dict] = field(default_factory=list)  # the measurements behind them, for the trial's user attrs
    records: dict[tuple[str, int, int], ProfileRecord] = field(default_factory=dict)  # by option choice
    total_steps: int = 0


@dataclass(frozen=True)
class _Resolved:
    """Where a (strategy, device count) stands in the store: the accumulation factor that fits (``record``
    feasible), the one to measure next (``record`` None), or none that can (``record`` infeasible); ``tried``
    are the out-of-memory records walked past to get there."""

    gradient_accumulation: int
    key: str
    record: ProfileRecord | None
    tried: tuple[ProfileRecord, ...] = ()


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
        # Options that crashed or refused the trial's code, by profile key (which includes the optimizer's class):
        # never planned in this sweep, and not stored, so that a fixed objective is measured again next time.
        self._failed: dict[str, ProfileRecord] = {}
        self._warned_probe = False

    def plan_measurements(self, trials: Sequence[optuna.Trial]) -> list[ProfileJob]:
        """Dry-run each trial; return the launches that measure every uncached, possibly-feasible key once.

        Keys shared by several trials (they differ only in, say, learning rate) are measured once. Strategies
        of one launcher and device count share a launch, least memory first (so an out-of-memory run stops
        before the strategies that would need even more).
        """
        wanted = []
        for trial in trials:
            workload = self._probe(trial)
            self._workloads[trial.number] = workload
            if workload is not None:
                wanted += [(trial, workload, s, n) for s, n in self._candidates(workload)]
        return self._launches(wanted, seen=set())

    def _launches(
        self, wanted: Sequence[tuple[optuna.Trial, Workload, Strategy, int]], *, seen: set[str]
    ) -> list[ProfileJob]:
        """Group what still needs measuring into launches, skipping keys in ``seen`` (measured by another)."""
        groups: dict[tuple[int, int, str, int], list[tuple[Strategy, str]]] = {}
        context: dict[int, tuple[optuna.Trial, Workload]] = {}
        for trial, workload, strategy, devices in wanted:
            resolved = self._resolve(workload, strategy, devices)
            if (
                resolved is None or resolved.record is not None or resolved.key in seen
                or resolved.key in self._failed
            ):
                continue
            seen.add(resolved.key)
            context[trial.number] = (trial, workload)
            group = (trial.number, devices, strategy.launcher, resolved.gradient_accumulation)
            groups.setdefault(group, []).append((strategy, resolved.key))
        jobs = []
        for (number, devices, _, accumulation), members in groups.items():
            trial, workload = context[number]
            members.sort(key=lambda m: model_state_bytes(workload.n_params, workload.bytes_per_param, m[0], devices))
            jobs.append(ProfileJob(
                trial, tuple(m[0] for m in members), tuple(m[1] for m in members), devices, workload, accumulation
            ))
        return sorted(jobs, key=lambda j: (-j.devices, j.name))

    def record(
        self, job: ProfileJob, results: Sequence[dict], launched_at: float, exit_seconds: float | None = None,
        launch_error: str | None = None,
    ) -> list[ProfileRecord | None]:
        """Store what a launch measured, one record per strategy it reached (None: not reached).

        Each strategy's start-up is the launch's own (process start to the first objective call) plus that
        strategy's set-up (objective call to first step), and its exit the launch's own (last result to the
        processes' exit, which the devices wait for), as if it had been launched alone. A strategy that crashed
        or refused the trial's code gets a failed record, kept for this sweep: it is never planned for a trial of
        that key.
        ``launch_error``: the launch died without saying which strategy it was running; the first one it did not
        report on is taken as the one that failed.
        """
        by_name = {r.get("strategy"): r for r in results}
        first = results[0] if results else {}
        launch_overhead = max(0.0, first.get("objective_started_at", launched_at) - launched_at)
        records: list[ProfileRecord | None] = []
        for strategy, key in zip(job.strategies, job.keys):
            outcome = by_name.get(strategy.name)
            common = {"key": key, "strategy": strategy.name, "devices": job.devices, "hardware": self._hardware,
                      "n_params": job.workload.n_params, "batch_signature": job.workload.batch_signature,
                      "gradient_accumulation": job.gradient_accumulation}
            if outcome is None and launch_error is not None:
                outcome, launch_error = {"failed": True, "error": launch_error}, None
            if outcome is None:
                records.append(None)
                continue
            if outcome.get("failed"):
                record = ProfileRecord(**common, feasible=False, failed=True, error=outcome.get("error", "failed"))
                self._failed[key] = record
                records.append(record)
                continue
            if outcome.get("infeasible"):
                record = ProfileRecord(
                    **common, feasible=False, more_micro_batches_may_fit=bool(outcome.get("oom_in_steps")),
                    error=outcome.get("error", "out of memory"),
                )
            else:
                steps = sorted(outcome["step_seconds"])
                record = ProfileRecord(
                    **common, feasible=True, step_seconds=steps[len(steps) // 2],
                    startup_seconds=launch_overhead + outcome["first_step_at"] - outcome["objective_started_at"],
                    tail_seconds=outcome.get("tail_seconds"), exit_seconds=exit_seconds,
                    peak_memory_bytes=int(outcome.get("peak_memory_bytes") or 0), timed_steps=len(steps),
                    loop_steps=list(outcome.get("loop_steps") or []), between_seconds=outcome.get("between_seconds"),
                )
            self._store.put(record)
            records.append(record)
        return records

    def follow_ups(self, job: ProfileJob, records: Sequence[ProfileRecord | None]) -> list[ProfileJob]:
        """After a launch stopped early (out of memory, a crash): the strategies it did not reach, and the one
        that ran out of memory again with more micro-batches (if it has more to try), as new launches."""
        if not any(r is not None and not r.feasible for r in records):
            return []
        again = [
            (job.trial, job.workload, s, job.devices)
            for s, r in zip(job.strategies, records) if r is None or (not r.feasible and not r.failed)
        ]
        return self._launches(again, seen=set())

    def options_for(self, trial: optuna.Trial) -> TrialOptions:
        """Every feasible option of the trial (not only the best per device count), with measured runtimes not yet
        corrected by the sweep's observations, and its profile summary."""
        workload = self._workloads.get(trial.number)
        if workload is None:
            return TrialOptions(self._estimator.options())
        priced = TrialOptions([], total_steps=workload.total_steps)
        for strategy, devices in self._candidates(workload):
            resolved = self._resolve(workload, strategy, devices)
            if resolved is None:
                continue
            failed = self._failed.get(resolved.key)
            measured = [*resolved.tried, *([resolved.record or failed] if resolved.record or failed else [])]
            priced.profiles.extend(self._summary(r) for r in measured)
            if failed is not None:
                continue  # crashed or refused this trial's code: never planned for it
            record, accumulation = resolved.record, resolved.gradient_accumulation
            if record is None:  # not measured (profiling budget): scale from what was measured
                estimate = self._estimator.estimate(strategy.name, devices, accumulation)
                priced.options.append(Option(strategy.name, devices, estimate, accumulation))
                continue
            runtime = record.whole_trial_seconds(workload.total_steps)
            if runtime is None:
                continue
            option = Option(strategy.name, devices, runtime, accumulation)
            priced.options.append(option)
            priced.records[option.choice] = record
        return priced

    def observe_run(self, key: str, step_seconds: float) -> None:
        """A real trial ran as the profile ``key``: keep its loop's real step rate (evaluation passes included)
        in the store, so later trials and sweeps with this key are priced by what really happened."""
        record = self._store.get(key)
        if record is None or not record.feasible or step_seconds <= 0:
            return
        runs = record.observed_runs
        previous = record.observed_step_seconds or 0.0
        record.observed_step_seconds = (previous * runs + step_seconds) / (runs + 1)
        record.observed_runs = runs + 1
        self._store.put(record)

    def _resolve(self, workload: Workload, strategy: Strategy, devices: int) -> _Resolved | None:
        """Walk the strategy's accumulation factors, fewest micro-batches first, past those that ran out of
        memory. None: no factor splits this trial's batch on ``devices`` devices."""
        last, tried = None, ()
        for accumulation in self._accumulation_factors(workload, strategy, devices):
            key = self._key(workload, strategy, devices, accumulation)
            last = _Resolved(accumulation, key, self._store.get(key), tried)
            if last.record is None or last.record.feasible or not last.record.more_micro_batches_may_fit:
                return last
            tried += (last.record,)
        return last

    @staticmethod
    def _summary(record: ProfileRecord) -> dict:
        summary = {
            "strategy": record.strategy, "devices": record.devices, "feasible": record.feasible,
            "step_seconds": record.step_seconds, "startup_seconds": record.startup_seconds,
            "tail_seconds": record.tail_seconds, "exit_seconds": record.exit_seconds,
            "observed_step_seconds": record.observed_step_seconds,
            "peak_memory_bytes": record.peak_memory_bytes, "key": record.key,
        }
        if record.gradient_accumulation > 1:
            summary["gradient_accumulation"] = record.gradient_accumulation
        if not record.feasible:
            summary["error"] = record.error
        if record.failed:
            summary["failed"] = True
        if len(record.loop_steps) > 1:
            summary["loops"] = len(record.loop_steps)
            summary["between_seconds"] = record.between_seconds
        return summary

    @staticmethod
    def _accumulation_factors(workload: Workload, strategy: Strategy, devices: int) -> list[int]:
        """The strategy's factors that split each device's share of the batch evenly (all, if the batch size is
        unknown; then a bad split is reported by the run)."""
        factors = list(strategy.accumulation_factors)
        if workload.global_batch is None or workload.global_batch % devices:
            return factors
        per_device = workload.global_batch // devices
        return [a for a in factors if per_device % a == 0] or factors[:1]

    def _candidates(self, workload: Workload) -> list[tuple[Strategy, int]]:
        """(strategy, device count) pairs whose model state can fit at all (analytic bound, no launch)."""
        return [
            (strategy, devices)
            for strategy in self._strategies
            for devices in strategy.device_counts(len(self._pool))
            if model_state_bytes(workload.n_params, workload.bytes_per_param, strategy, devices) <= self._memory
        ]

    def _key(self, workload: Workload, strategy: Strategy, devices: int, gradient_accumulation: int) -> str:
        return profile_key(
            workload.model_signature, workload.batch_signature, strategy, devices, self._hardware,
            gradient_accumulation,
        )

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
