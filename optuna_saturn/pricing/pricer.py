"""What each trial may run as, and how long each option would take: measured where a profile exists, predicted by
the cost model where none does.

A trial is described before anything runs (:func:`~optuna_saturn.profiler.probe_workload`, in the pool's describer
process: :mod:`optuna_saturn.pools.describing`): its model's and batch's
shapes make the profile keys, so trials that differ only in learning rate share every measurement, across trials,
sweeps and restarts. Measurements come from profiling jobs (short timed runs) and from real runs: a trial that ran
under an option with no profile leaves one, from its own steps. Everything measured also trains the cost model,
which prices the options nobody measured for a workload (:mod:`optuna_saturn.pricing.step_time_model`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import optuna

from optuna_saturn.devices import Device
from optuna_saturn.planner import Option
from optuna_saturn.pricing.descriptions import Descriptions
from optuna_saturn.pricing.floors import no_better_than_linear_scaling
from optuna_saturn.pricing.learned import LearnedOverheads, overheads
from optuna_saturn.pricing.measured import record_of, within
from optuna_saturn.pricing.prices import PricedOption, ProfileEntry, ProfileJob, TrialPrice, summary
from optuna_saturn.pricing.profile_jobs import Wanted, grouped_into_jobs
from optuna_saturn.pricing.step_time_model import CostModel, Prediction
from optuna_saturn.pricing.sweep_store import SweepStore
from optuna_saturn.pricing.unprofiled import NOMINAL_TRIAL_SECONDS
from optuna_saturn.profiler import (
    ProfileRecord,
    ProfileStore,
    Work,
    Workload,
    hardware_fingerprint,
    model_state_bytes,
    profile_key,
)
from optuna_saturn.profiler._hardware import device_memory_bytes
from optuna_saturn.strategy import Strategy

_logger = optuna.logging.get_logger("optuna.saturn.profiler")


@dataclass(frozen=True)
class _Resolved:
    """Where a (strategy, device count) stands in the store: the accumulation factor that fits (``record``
    feasible), the one to measure next (``record`` None), or none that can (``record`` infeasible); ``tried``
    are the out-of-memory records walked past to get there."""

    gradient_accumulation: int
    key: str
    record: ProfileRecord | None
    tried: tuple[ProfileRecord, ...] = ()


class Pricer:
    """Describes trials, prices their options, turns measurements into profiles and the cost model."""

    def __init__(
        self,
        *,
        describe: Callable[[Any], Workload],
        strategies: Sequence[Strategy],
        pool: Sequence[Device],
        store: ProfileStore,
        max_devices: int | None = None,
        hardware: str | None = None,
        device_memory: int | None = None,
    ) -> None:
        """``describe``: a trial's workload, from its objective run in a process of the pool (never this one).
        ``max_devices``: the most devices one trial may use (a node's, on a cluster; default: the pool's).
        ``hardware`` and ``device_memory``: what the devices are, where they are not on this machine (measured
        on their node; default: measured here)."""
        self._descriptions = Descriptions(describe)
        self._strategies = {s.name: s for s in strategies}
        self._pool = list(pool)
        self._max_devices = max_devices or len(self._pool)
        self._store = SweepStore(store, self._pool)  # (an out-of-memory beside another process: this sweep's only)
        self._hardware = hardware or hardware_fingerprint(pool[0])
        self._memory = device_memory or device_memory_bytes(pool)
        # Options that crashed or refused the trial's code, by profile key (which includes the optimizer's class):
        # never planned in this sweep, and not stored, so that a fixed objective is measured again next time.
        self._failed: dict[str, ProfileRecord] = {}
        self._queued: set[str] = set()  # keys a profiling job will measure (queued or running)
        self.cost_model = CostModel()
        self._learned = LearnedOverheads()  # feasible profiles of this hardware (the latest)
        self._reference_work = 0.0  # FLOPs of the first trial priced before anything was measured
        self._early: dict[int, str] = {}  # running trial -> the key of the profile its first steps made
        for record in store.records():
            self._learn(record)

    # -- describing and pricing -----------------------------------------------------------------------------------
    def describe(self, trial: optuna.Trial) -> Workload | None:
        """The trial's workload (:class:`~optuna_saturn.pricing.descriptions.Descriptions`)."""
        return self._descriptions.of(trial)

    def workload(self, number: int) -> Workload | None:
        return self._descriptions.known(number)

    def forget(self, number: int) -> None:
        self._descriptions.forget(number)

    @property
    def prepares_nothing(self) -> bool:
        return self._descriptions.prepares_nothing

    def price(self, trial: optuna.Trial) -> TrialPrice:
        """Every option the trial may run as (feasible, not failed), each measured or predicted."""
        workload = self.describe(trial)
        if workload is None:
            return TrialPrice.undescribed(self._descriptions.failure(trial.number))
        price = TrialPrice(workload)
        measured_here: list[ProfileRecord] = []
        pending: list[tuple[Strategy, int, _Resolved]] = []
        for strategy, devices in self._candidates(workload):
            resolved = self._resolve(workload, strategy, devices)
            if resolved is None:
                continue
            failed = self._failed.get(resolved.key)
            shown = [*resolved.tried, *filter(None, [resolved.record or failed])]
            price.profiles.extend(summary(r) for r in shown)
            if failed is not None or (resolved.record is not None and not resolved.record.feasible):
                continue  # crashed, refused the trial's code, or no micro-batch count fits
            if resolved.record is not None:
                runtime = resolved.record.whole_trial_seconds(workload.total_steps)
                if runtime is not None:
                    measured_here.append(resolved.record)
                    price.options.append(
                        PricedOption(
                            Option(strategy.name, devices, runtime, resolved.gradient_accumulation),
                            resolved.key,
                            resolved.record,
                        )
                    )
                continue
            pending.append((strategy, devices, resolved))
        for strategy, devices, resolved in pending:  # predicted, with what this trial's measurements say
            family = (strategy.name, devices, resolved.gradient_accumulation)
            prediction = self.cost_model.predict(family, workload.work)
            runtime = self._predicted_runtime(workload, prediction, measured_here)
            price.options.append(
                PricedOption(
                    Option(strategy.name, devices, runtime, resolved.gradient_accumulation),
                    resolved.key,
                    None,
                    prediction.uncertainty,
                    prediction.basis,
                )
            )
        price.options = no_better_than_linear_scaling(price.options, self._strategies)
        return price

    def _predicted_runtime(
        self, workload: Workload, prediction: Prediction, measured: Sequence[ProfileRecord]
    ) -> float:
        """A whole trial at a predicted step time: its loops, start-up and end as measured for this workload under
        other options (or, with none, as measured for any workload; with nothing measured at all, steps only)."""
        steps = (
            statistics.median(r.trial_steps(workload.total_steps) for r in measured)
            if measured
            else float(workload.total_steps)
        )
        if not measured and not self._learned and not any(True for _ in self.cost_model.families()):
            # Nothing measured on this hardware yet: the prior knows sizes, not seconds. Trials are priced by their
            # work relative to the first one described, which is given the placeholder length of a trial.
            work = workload.work.flops * steps
            self._reference_work = self._reference_work or work
            return (
                NOMINAL_TRIAL_SECONDS * work / self._reference_work * prediction.seconds / self._prior_single(workload)
            )
        startup, after = overheads(measured) if measured else self._learned.overheads()
        return startup + steps * prediction.seconds + after

    def _prior_single(self, workload: Workload) -> float:
        """The prior's step time of one device without accumulation, the unit the placeholder scales."""
        return self.cost_model.predict(("single", 1, 1), workload.work).seconds

    # -- profiling jobs -------------------------------------------------------------------------------------------
    def profile_jobs(
        self, wanted: Sequence[tuple[optuna.Trial | optuna.trial.FixedTrial, tuple[str, int, int]]]
    ) -> list[ProfileJob]:
        """Group the options to measure (trial, option choice) into profiling jobs (:mod:`.profile_jobs`), skipping
        keys already measured, failed or wanted twice."""
        kept: list[Wanted] = []
        seen: set[str] = set()
        for trial, (name, devices, accumulation) in wanted:
            workload = self._descriptions.known(trial.number)
            strategy = self._strategies.get(name)
            if workload is None or strategy is None:
                continue
            key = self._key(workload, strategy, devices, accumulation)
            if key in seen or key in self._queued or key in self._failed or self._store.get(key) is not None:
                continue
            seen.add(key)
            self._queued.add(key)
            kept.append(Wanted(trial, workload, strategy, key, devices, accumulation))
        return grouped_into_jobs(kept)

    def record(
        self, job: ProfileJob, results: dict[int, list[dict]], started_at: float, unreported: dict | None = None
    ) -> list[tuple[ProfileEntry, Strategy, ProfileRecord | None]]:
        """Store what a profiling job measured: one record per (trial, strategy) it reached (None: not reached).

        Each strategy's start-up is the time from the job's start to that strategy's first step as if it had run
        alone (the job's own start-up, plus the objective's set-up under that strategy). A strategy that crashed
        or refused the trial's code gets a failed record, kept for this sweep: it is never planned for a trial of
        that key. ``unreported``: the job ended without rank 0's report of the strategy it was running (a peer
        failed first: see :func:`optuna_saturn.sweep.measuring.profile_results`); it is that trial's strategy's
        outcome, or, where it does not name one, the outcome of the first one not reported on.
        """
        out: list[tuple[ProfileEntry, Strategy, ProfileRecord | None]] = []
        self._queued.difference_update(k for e in job.entries for k in e.keys)
        first = next((r for rs in results.values() for r in rs), {})
        overhead = max(0.0, first.get("objective_started_at", started_at) - started_at)
        for entry in job.entries:
            by_name = {r.get("strategy"): r for r in results.get(entry.trial.number, [])}
            for strategy, key in zip(entry.strategies, entry.keys):
                outcome = by_name.get(strategy.name)
                if (
                    outcome is None
                    and unreported is not None
                    and unreported["strategy"] in (None, strategy.name)
                    and unreported["trial"] in (None, entry.trial.number)
                ):
                    outcome, unreported = unreported, None
                record = (
                    None
                    if outcome is None
                    else self._record_from(outcome, key, strategy, job, entry.workload, overhead)
                )
                out.append((entry, strategy, record))
        return out

    def _record_from(
        self, outcome: dict, key: str, strategy: Strategy, job: ProfileJob, workload: Workload, overhead: float
    ) -> ProfileRecord:
        common = self._common(key, strategy.name, job.devices, job.gradient_accumulation, workload)
        record = record_of(outcome, common, overhead=overhead)
        if record.failed:
            self._failed[key] = record
            return record
        self._store.put(record)
        self._learn(record)
        return within(record, self._memory)

    def follow_ups(
        self, job: ProfileJob, recorded: Sequence[tuple[ProfileEntry, Strategy, ProfileRecord | None]]
    ) -> list[ProfileJob]:
        """After a job stopped early (out of memory, a crash): the (trial, strategy) pairs it did not reach, and
        those that ran out of memory again with more micro-batches (if they have more to try), as new jobs."""
        if not any(r is not None and not r.feasible for _, _, r in recorded):
            return []
        again = []
        for entry, strategy, record in recorded:
            if record is None or (not record.feasible and not record.failed):
                resolved = self._resolve(entry.workload, strategy, job.devices)
                if resolved is not None and resolved.record is None:
                    again.append((entry.trial, (strategy.name, job.devices, resolved.gradient_accumulation)))
        return self.profile_jobs(again)

    # -- real runs ------------------------------------------------------------------------------------------------
    def learn_from_run(
        self,
        number: int,
        option: Option,
        *,
        step_seconds: float,
        steps: int,
        startup_seconds: float | None,
        tail_seconds: float | None,
        loop_steps: list[int],
        early: bool = False,
    ) -> bool:
        """A trial ran ``steps`` steps under ``option`` at ``step_seconds`` each (its whole loop's real rate,
        evaluation passes and the time between loops included). With no profile for its key, the run becomes
        that profile; with one, its real rate is kept beside the timed one (``observed_step_seconds``). Returns
        whether it learned anything (then the waiting trials' prices may change). ``early``: the trial still runs,
        and its steps so far make a profile only where none exists; its end then replaces that profile."""
        common = self._run_record(number, option)
        if common is None or step_seconds <= 0 or steps < 1:
            return False
        key = common["key"]
        record = self._store.get(key)
        if early and record is not None:
            return False
        if not early and self._early.pop(number, None) == key and record is not None and record.observed_runs == 1:
            record = None  # the profile its own first steps made: the whole run replaces it
        if early:
            self._early[number] = key
        if record is None:
            record = ProfileRecord(
                **common,
                feasible=True,
                step_seconds=step_seconds,
                startup_seconds=startup_seconds,
                tail_seconds=tail_seconds,
                exit_seconds=0.0,
                timed_steps=steps,
                loop_steps=loop_steps,
                observed_step_seconds=step_seconds,
                observed_runs=1,
            )
        elif record.feasible:
            runs = record.observed_runs
            record.observed_step_seconds = ((record.observed_step_seconds or 0.0) * runs + step_seconds) / (runs + 1)
            record.observed_runs = runs + 1
        else:
            return False
        self._store.put(record)
        self._learn(record)
        return True

    def mark_failed(self, number: int, option: Option, error: str) -> None:
        """A real run under ``option`` crashed or refused the trial's code: like a failed profile, never planned
        for this workload in this sweep (and not stored)."""
        common = self._run_record(number, option)
        if common is not None:
            self._failed[common["key"]] = ProfileRecord(**common, feasible=False, failed=True, error=error[:2000])

    def mark_out_of_memory(self, number: int, option: Option, error: str) -> None:
        """A real run under ``option`` ran out of memory: the option is infeasible for this workload (and more
        micro-batches may fit)."""
        common = self._run_record(number, option)
        if common is not None:
            self._store.put(ProfileRecord(**common, feasible=False, more_micro_batches_may_fit=True, error=error[:500]))

    def _run_record(self, number: int, option: Option) -> dict | None:
        """What a record of trial ``number``'s run under ``option`` says of it (None: the trial was not described)."""
        workload, strategy = self._descriptions.known(number), self._strategies.get(option.strategy)
        if workload is None or strategy is None:
            return None
        key = self._key(workload, strategy, option.devices, option.gradient_accumulation)
        return self._common(key, option.strategy, option.devices, option.gradient_accumulation, workload)

    # -- the store --------------------------------------------------------------------------------------------------
    def _learn(self, record: ProfileRecord) -> None:
        if record.hardware != self._hardware or not record.feasible or not record.work_flops:
            return
        self._learned.add(record)
        step = record.observed_step_seconds or record.step_seconds
        if step:
            family = (record.strategy, record.devices, record.gradient_accumulation)
            self.cost_model.observe(family, Work(record.work_flops, record.work_param_bytes), step)

    def _common(self, key: str, strategy: str, devices: int, accumulation: int, workload: Workload) -> dict:
        work = workload.work
        return {
            "key": key,
            "strategy": strategy,
            "devices": devices,
            "hardware": self._hardware,
            "n_params": workload.n_params,
            "batch_signature": workload.batch_signature,
            "gradient_accumulation": accumulation,
            "work_flops": work.flops,
            "work_param_bytes": work.param_bytes,
        }

    def _resolve(self, workload: Workload, strategy: Strategy, devices: int) -> _Resolved | None:
        """Walk the strategy's accumulation factors, fewest micro-batches first, past those that ran out of
        memory. None: no factor splits this trial's batch on ``devices`` devices."""
        last: _Resolved | None = None
        tried: tuple[ProfileRecord, ...] = ()
        for accumulation in strategy.accumulation_factors_for(workload.global_batch, devices):
            key = self._key(workload, strategy, devices, accumulation)
            last = _Resolved(accumulation, key, within(self._store.get(key), self._memory), tried)
            if last.record is None or last.record.feasible or not last.record.more_micro_batches_may_fit:
                return last
            tried += (last.record,)
        return last

    def _candidates(self, workload: Workload) -> list[tuple[Strategy, int]]:
        """(strategy, device count) pairs whose model state can fit at all (analytic bound, no launch)."""
        return [
            (strategy, devices)
            for strategy in self._strategies.values()
            for devices in strategy.device_counts(self._max_devices)
            if model_state_bytes(
                workload.n_params,
                workload.bytes_per_param,
                strategy,
                devices,
                optimizer_states=workload.optimizer_states,
            )
            <= self._memory
        ]

    def _key(self, workload: Workload, strategy: Strategy, devices: int, gradient_accumulation: int) -> str:
        return profile_key(
            workload.model_signature, workload.batch_signature, strategy, devices, self._hardware, gradient_accumulation
        )
