"""One call of :meth:`SaturnExecutor.optimize`: ask a batch, plan it, run it, tell the results, repeat.

The loop is single-threaded; only the channel server answers workers from its own threads, under the study lock.
"""

from __future__ import annotations

import glob
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from optuna_saturn._profiling import BatchProfiler, ProfileJob, TrialOptions
from optuna_saturn._session import TrialSession
from optuna_saturn.channel import ChannelServer
from optuna_saturn.devices import Device
from optuna_saturn.estimates import RuntimeEstimator
from optuna_saturn.events import ProfileEvent, SweepListener, TrialProgress, TrialStart
from optuna_saturn.planner import Assignment, Cluster, Job, Option, Plan, Reservation, replan, solve
from optuna_saturn.planner._types import option_label
from optuna_saturn.profiler import ProfileStore
from optuna_saturn.runner import LaunchedTrial, LocalRunner, build_launch
from optuna_saturn.strategy import Strategy

_logger = optuna.logging.get_logger("optuna.saturn")
_POLL_SECONDS = 0.05
_REPLAN_SECONDS = 1.0  # re-plans happen while devices may be idle: keep them short
_LOG_TAIL_LINES = 20
ATTR = "saturn:"


@dataclass
class _Scheduled:
    trial: optuna.Trial
    assignment: Assignment
    planned_start: float  # seconds since the sweep started
    planned_end: float


@dataclass
class _Active:
    scheduled: _Scheduled
    session: TrialSession
    token: str
    launched: LaunchedTrial
    devices: list[int]
    start: float
    spec_path: str
    reported_step: int = 0


@dataclass(frozen=True)
class SweepSettings:
    devices: Sequence[Device]
    strategies: Sequence[Strategy]
    solver: str
    time_limit: float
    log_dir: Path
    isolate_network: bool
    artifact_store: Any
    grace_period: float
    listeners: Sequence[SweepListener] = ()
    profile_store: ProfileStore | None = None  # None: plan from runtime estimates only
    profile_steps: tuple[int, int] = (2, 5)  # warm-up steps, timed steps
    profile_budget: float | None = None  # seconds of profiling per batch
    profile_only: bool = False  # measure and record profiles, run no trial


@dataclass
class _Measuring:
    job: ProfileJob
    session: TrialSession
    token: str
    launched: LaunchedTrial
    devices: list[int]
    launched_at: float
    spec_path: str


class Sweep:
    def __init__(
        self,
        settings: SweepSettings,
        study: optuna.Study,
        objective: Callable[..., Any],
        objective_recipe: Callable[[str], dict],
        *,
        n_trials: int | None,
        timeout: float | None,
        batch_size: int,
    ) -> None:
        self.settings = settings
        self.study = study
        self._objective_recipe_factory = objective_recipe
        self.n_trials = n_trials
        self.timeout = timeout
        self.batch_size = batch_size
        self._strategies = {s.name: s for s in settings.strategies}
        self._estimator = RuntimeEstimator(settings.strategies, len(settings.devices))
        self._lock = threading.Lock()
        self._pending: deque[_Scheduled] = deque()
        self._active: dict[int, _Active] = {}
        self._free = set(range(len(settings.devices)))
        self._asked = 0
        self._start = time.time()
        self._run_dir = settings.log_dir / f"{_safe(study.study_name)}-{time.strftime('%Y%m%d-%H%M%S')}"
        self._listeners = list(settings.listeners)
        self._options: dict[int, TrialOptions] = {}  # profile-based options, per trial number
        self._waiting: list[optuna.Trial] = []  # asked, waiting for their profiles before planning
        self._measure_queue: deque[ProfileJob] = deque()
        self._measuring: dict[str, _Measuring] = {}
        self._profile_deadline = float("inf")
        self._profile_seconds = 0.0  # device-seconds spent in profiling runs
        self._profile_wall = 0.0  # seconds batches waited for their profiles
        self._profile_runs = 0
        self._profile_started = 0.0
        self._profiling_runs: dict[int, list[dict]] = {}  # per trial: where and when its profiling launches ran
        self._profiler = None if settings.profile_store is None else BatchProfiler(
            objective=objective, strategies=settings.strategies, pool=settings.devices,
            store=settings.profile_store, estimator=self._estimator, lock=self._lock,
        )

    def _notify(self, method: str, *args: Any) -> None:
        for listener in list(self._listeners):
            try:
                getattr(listener, method)(self.study, *args)
            except Exception:
                _logger.exception(f"Listener {listener!r} failed in {method}; it is dropped, the sweep goes on.")
                self._listeners.remove(listener)

    # -- the loop ---------------------------------------------------------------------------------------------------
    def run(self) -> None:
        runner = LocalRunner(grace_period=self.settings.grace_period)
        self._notify("on_sweep_start", [str(d) for d in self.settings.devices], self._start)
        with ChannelServer() as server:
            recipe = self._objective_recipe_factory(os.path.dirname(server.address))
            try:
                while True:
                    trial_ended = False
                    for launched, code in self._ended(runner):
                        if launched.key in self._measuring:
                            self._finish_measurement(self._measuring.pop(launched.key), server, returncode=code)
                        else:
                            self._finish(self._active.pop(launched.key), code, server)
                            trial_ended = True
                    if trial_ended:  # start what the plan has next at once, then re-plan the rest
                        self._dispatch(runner, server, recipe)
                        self._replan()
                    if not self._pending and not self._waiting and self._free and self._may_ask():
                        self._ask_batch()
                    if self._waiting:
                        self._advance_profiling(runner, server, recipe)
                    self._dispatch(runner, server, recipe)
                    self._relay_progress()
                    if not (self._pending or self._active or self._waiting or self._may_ask()):
                        break
                    time.sleep(_POLL_SECONDS)
            except BaseException as exc:
                reason = "interrupted (KeyboardInterrupt)" if isinstance(exc, KeyboardInterrupt) else repr(exc)
                self._abort(runner, server, reason)
                self._notify("on_sweep_end", self._elapsed(), True)
                raise
        self._log_summary()
        self._notify("on_sweep_end", self._elapsed(), False)

    def _ended(self, runner: LocalRunner) -> list[tuple[LaunchedTrial, int | None]]:
        """Launches that exited, then trials that linger after reporting (each listed once)."""
        ended = runner.poll()
        exited = {launched.key for launched, _ in ended}
        return ended + self._reap_lingering(runner, exclude=exited)

    def _reap_lingering(self, runner: LocalRunner, *, exclude: set) -> list[tuple[LaunchedTrial, int | None]]:
        """Stop trials that reported how they ended but whose processes have not exited after the grace period:
        their result is safe with us, and their devices are needed."""
        now = time.time()
        lingering = [
            a for a in self._active.values()
            if a.launched.key not in exclude
            and a.session.outcome_at is not None and now - a.session.outcome_at > self.settings.grace_period
        ]
        for active in lingering:
            _logger.warning(f"Trial {active.session.trial.number} reported its result but did not exit; stopping it.")
        return [(a.launched, runner.stop(a.launched.key)) for a in lingering]

    def _relay_progress(self) -> None:
        for active in self._active.values():
            session = active.session
            if session.step != active.reported_step:
                active.reported_step = session.step
                self._notify(
                    "on_trial_progress",
                    TrialProgress(session.trial.number, session.step, session.total_steps, session.step_seconds),
                )

    def _may_ask(self) -> bool:
        if self.n_trials is not None and self._asked >= self.n_trials:
            return False
        return self.timeout is None or time.time() - self._start < self.timeout

    def _elapsed(self) -> float:
        return time.time() - self._start

    # -- ask and plan -----------------------------------------------------------------------------------------------
    def _ask_batch(self) -> None:
        count = self.batch_size if self.n_trials is None else min(self.batch_size, self.n_trials - self._asked)
        with self._lock:
            trials = [self.study.ask() for _ in range(count)]
        self._asked += count
        self._waiting = trials
        if self._profiler is not None:
            jobs = self._profiler.plan_measurements(trials)
            self._measure_queue = deque(jobs)
            budget = self.settings.profile_budget
            self._profile_deadline = time.time() + budget if budget is not None else float("inf")
            self._profile_started = time.time()
            if jobs:
                _logger.info(
                    f"Profiling {len(jobs)} option(s) for trials {[t.number for t in trials]}: "
                    + ", ".join(f"{j.name} (trial {j.trial.number})" for j in jobs)
                )

    def _advance_profiling(self, runner: LocalRunner, server: ChannelServer, recipe: dict) -> None:
        """Measure what the batch needs on the free devices (largest first), then plan the batch."""
        if time.time() > self._profile_deadline and (self._measure_queue or self._measuring):
            _logger.warning(
                f"Profiling budget of {self.settings.profile_budget} s spent; {len(self._measure_queue)} option(s) "
                "left unmeasured are estimated from the measured ones."
            )
            self._measure_queue.clear()
            for key in list(self._measuring):
                runner.stop(key)
                self._finish_measurement(self._measuring.pop(key), server, stopped=True)
        for job in list(self._measure_queue):
            if job.devices <= len(self._free):
                self._measure_queue.remove(job)
                self._start_measurement(job, runner, server, recipe)
        if not self._measure_queue and not self._measuring:
            self._plan_batch()

    def _start_measurement(self, job: ProfileJob, runner: LocalRunner, server: ChannelServer, recipe: dict) -> None:
        device_ids = sorted(self._free)[: job.devices]
        key = f"profile-{job.trial.number}-{job.name}"
        warmup, timed = self.settings.profile_steps
        session, token, launched, spec_path = self._start_process(
            job.trial, job.strategies[0], device_ids, runner, server, recipe, key=key,
            profile={
                "warmup": warmup, "timed": timed, "strategies": [s.to_json() for s in job.strategies],
                "gradient_accumulation": job.gradient_accumulation,
            },
            log_name=f"{key}.log",
        )
        self._measuring[key] = _Measuring(job, session, token, launched, device_ids, time.time(), spec_path)
        self._notify("on_profile", ProfileEvent(job.trial.number, job.name, "started"))

    def _finish_measurement(
        self, measuring: _Measuring, server: ChannelServer, *, stopped: bool = False, returncode: int | None = None
    ) -> None:
        server.unregister(measuring.token)
        self._free |= set(measuring.devices)
        self._profile_seconds += (time.time() - measuring.launched_at) * len(measuring.devices)
        self._profile_runs += 1
        job = measuring.job
        results = measuring.session.profiles
        ended_early = any(r.get("infeasible") or r.get("stop_launch") for r in results)
        # Only a launch that ended normally times a normal exit (not one stopped, failed or out of memory).
        clean = not stopped and measuring.session.outcome is None and len(results) == len(job.strategies) and not (
            ended_early
        )
        last_result_at = measuring.session.outcome_at
        exit_seconds = max(0.0, time.time() - last_result_at) if clean and last_result_at is not None else None
        launch_error = None
        if not stopped and not ended_early and len(results) < len(job.strategies):  # it died without saying why
            launch_error = _first_rank_error(measuring.spec_path) or (
                f"the profiling launch exited with code {returncode} before reporting (log: "
                f"{measuring.launched.log_path})"
            )
        records = self._profiler.record(job, results, measuring.launched_at, exit_seconds, launch_error)
        self._record_profiling_run(measuring)
        follow_ups = [] if stopped else self._profiler.follow_ups(job, records)  # the budget is spent
        self._measure_queue.extend(follow_ups)
        for strategy, record in zip(job.strategies, records):
            option = option_label(strategy.name, job.devices, job.gradient_accumulation)
            if record is None:
                summary = (
                    "not reached, measured in another launch" if follow_ups
                    else "not measured (profiling budget spent), so it is estimated"
                )
            elif record.failed:
                summary = f"cannot run this trial, so it is not planned for it: {record.error}"
            elif not record.feasible:
                summary = f"does not fit ({record.error})"
            else:
                loops = f", {len(record.loop_steps)} loops" if len(record.loop_steps) > 1 else ""
                summary = (
                    f"{record.step_seconds * 1e3:.1f} ms/step, start-up {record.startup_seconds:.1f} s, "
                    f"after the loop {record.tail_seconds or 0.0:.1f} s{loops}, "
                    f"peak {record.peak_memory_bytes / 2**20:.0f} MiB"
                )
            log = _logger.warning if record is not None and record.failed else _logger.info
            log(f"Profiled {option} (trial {job.trial.number}): {summary}.")
            self._notify("on_profile", ProfileEvent(job.trial.number, option, "done", summary))

    def _record_profiling_run(self, measuring: _Measuring) -> None:
        """Keep where and when the launch ran on its trial, so the schedule chart can show the devices' time
        spent profiling (the trial is still RUNNING: its attributes can still be set)."""
        trial = measuring.job.trial
        run = {
            "option": measuring.job.name, "devices": [str(self.settings.devices[i]) for i in measuring.devices],
            "start": round(measuring.launched_at - self._start, 3), "end": round(self._elapsed(), 3),
        }
        runs = self._profiling_runs.setdefault(trial.number, [])
        runs.append(run)
        with self._lock:
            trial.set_user_attr(ATTR + "profiling", runs)

    def _plan_batch(self) -> None:
        if self._profile_started:
            self._profile_wall += time.time() - self._profile_started
            self._profile_started = 0.0
        trials, self._waiting = self._waiting, []
        runnable = []
        for trial in trials:
            priced = (
                self._profiler.options_for(trial) if self._profiler is not None
                else TrialOptions(self._estimator.options())
            )
            options, profiles = priced.options, priced.profiles
            with self._lock:  # what the planner chose from, so `optuna-saturn plan/simulate` can re-plan later
                trial.set_user_attr(ATTR + "options", [o.to_json() for o in options])
                if profiles:
                    trial.set_user_attr(ATTR + "profiles", profiles)
                if not options:
                    reason = "no strategy fits this trial on these devices (every option ran out of memory)"
                    trial.set_user_attr(ATTR + "fail_reason", reason)
                    self.study.tell(trial, state=TrialState.FAIL)
                    _logger.warning(f"Trial {trial.number} failed: {reason}.")
                    continue
            if profiles:
                self._options[trial.number] = priced
            runnable.append(trial)
        if not runnable or self.settings.profile_only:
            return
        plan = self._plan([(t, None) for t in runnable], solve_time=self.settings.time_limit)
        _logger.info(
            f"Planned trials {[t.number for t in runnable]} with solver {plan.solver!r}: "
            + ", ".join(f"#{a.job} {a.option.label}" for a in plan.assignments)
        )

    def _replan(self) -> None:
        """Event-driven re-plan of the trials not started yet, with runtimes corrected by what was observed;
        the planner keeps the current plan unless the new one is clearly better (hysteresis)."""
        if self._pending:
            self._plan([(s.trial, s.assignment) for s in self._pending], solve_time=_REPLAN_SECONDS)

    def _plan(self, pending: list[tuple[optuna.Trial, Assignment | None]], *, solve_time: float) -> Plan:
        now = self._elapsed()
        jobs = [Job(str(t.number), self._job_options(t.number)) for t, _ in pending]
        busy = [
            Reservation(0, tuple(a.devices), self._remaining(a, now), str(a.session.trial.number))
            for a in self._active.values()
        ]
        previous = [a for _, a in pending if a is not None]
        cluster = Cluster([len(self.settings.devices)])
        if previous:
            plan = replan(Plan(tuple(previous)), jobs, cluster, busy=busy, solver=self.settings.solver,
                          time_limit=solve_time)
        else:
            plan = solve(jobs, cluster, self.settings.solver, solve_time, busy=busy)
        by_name = {str(t.number): t for t, _ in pending}
        self._pending = deque(
            _Scheduled(by_name[a.job], a, now + a.start, now + a.end)
            for a in sorted(plan.assignments, key=lambda a: (a.start, a.job))
        )
        self._notify("on_plan", plan, [t.number for t, _ in pending], now)
        return plan

    def _job_options(self, number: int) -> list[Option]:
        """Profile-based options corrected by what this sweep observed so far, else the estimator's guesses."""
        measured = self._options.get(number)
        if not measured:
            return self._estimator.options()
        corrected = []
        for o in measured.options:
            record = measured.records.get(o.choice)
            if record is not None and not record.observed:  # timed steps: scale the loop by the real step rate
                loop_seconds = record.trial_steps(measured.total_steps) * record.step_seconds
                o = replace(o, runtime=self._estimator.corrected(o.runtime, loop_seconds))
            corrected.append(o)
        return corrected

    def _remaining(self, active: _Active, now: float) -> float:
        """Seconds a running trial still needs: from its measured step rate when it reports one, plus what its
        profile says follows the loop (final evaluation, exit)."""
        session = active.session
        if session.step_seconds is not None and session.total_steps:
            measured = self._options.get(session.trial.number)
            record = measured.records.get(active.scheduled.assignment.option.choice) if measured else None
            after_loop = record.after_loop_seconds if record is not None else 0.0
            # the loops this trial has started, or all its profile counted (later epochs), whichever is more
            total = max(session.total_steps, record.trial_steps(measured.total_steps) if record is not None else 0)
            return max(0.0, (total - session.step) * session.step_seconds) + after_loop
        return max(0.0, active.start + active.scheduled.assignment.option.runtime - now)

    # -- launch -----------------------------------------------------------------------------------------------------
    def _dispatch(self, runner: LocalRunner, server: ChannelServer, recipe: dict) -> None:
        """Start every pending trial whose planned devices are free and that is next in plan order on each."""
        claimed: set[int] = set()
        for scheduled in list(self._pending):
            devices = set(scheduled.assignment.devices)
            if devices <= self._free and not devices & claimed:
                self._pending.remove(scheduled)
                self._launch(scheduled, runner, server, recipe)
            claimed |= devices

    def _launch(self, scheduled: _Scheduled, runner: LocalRunner, server: ChannelServer, recipe: dict) -> None:
        trial = scheduled.trial
        strategy = self._strategies[scheduled.assignment.option.strategy]
        device_ids = list(scheduled.assignment.devices)
        session, token, launched, spec_path = self._start_process(
            trial, strategy, device_ids, runner, server, recipe, key=trial.number, log_name=f"trial-{trial.number}.log",
            gradient_accumulation=scheduled.assignment.option.gradient_accumulation,
        )
        self._active[trial.number] = _Active(
            scheduled, session, token, launched, device_ids, self._elapsed(), spec_path
        )
        devices = [self.settings.devices[i] for i in device_ids]
        _logger.info(
            f"Trial {trial.number} started: {strategy.name} on {', '.join(map(str, devices))}"
            + _accumulation_note(scheduled.assignment.option.gradient_accumulation) + " "
            f"(log: {launched.log_path})"
        )
        self._notify("on_trial_start", TrialStart(
            trial.number, strategy.name, tuple(map(str, devices)), scheduled.planned_start, scheduled.planned_end,
            self._active[trial.number].start,
        ))

    def _start_process(
        self,
        trial: optuna.Trial,
        strategy: Strategy,
        device_ids: list[int],
        runner: LocalRunner,
        server: ChannelServer,
        recipe: dict,
        *,
        key: Any,
        log_name: str,
        profile: dict | None = None,
        gradient_accumulation: int = 1,
    ) -> tuple[TrialSession, str, LaunchedTrial, str]:
        """Write the worker's spec (in the private folder) and launch it on ``device_ids``."""
        devices = [self.settings.devices[i] for i in device_ids]
        session = TrialSession(trial, self._lock)
        token = server.register(session.handle)
        spec_path = os.path.join(os.path.dirname(server.address), f"{_safe(str(key))}.json")
        with open(spec_path, "w", encoding="utf-8") as f:
            json.dump({
                "channel": server.address, "token": token, "objective": recipe, "trial_number": trial.number,
                "devices": [d.to_json() for d in devices], "strategy": strategy.to_json(),
                "profile": profile, "gradient_accumulation": gradient_accumulation,
            }, f)
        os.chmod(spec_path, 0o600)
        launch = build_launch(strategy, devices, spec_path, isolate_network=self.settings.isolate_network)
        launched = runner.launch(key, launch, self._run_dir / log_name)
        self._free -= set(device_ids)
        return session, token, launched, spec_path

    # -- finish -----------------------------------------------------------------------------------------------------
    def _finish(self, active: _Active, returncode: int | None, server: ChannelServer, reason: str = "") -> None:
        server.unregister(active.token)
        self._free |= set(active.devices)
        session, trial = active.session, active.session.trial
        end = self._elapsed()
        outcome = session.outcome or {}
        op = outcome.get("op")
        if not reason and op in ("fail", None):
            reason = _first_rank_error(active.spec_path) or (
                f"worker exited with code {returncode} before reporting a result"
            )
        attrs = self._attrs(active, end)
        if reason:
            attrs[ATTR + "fail_reason"] = reason
        state, values = TrialState.FAIL, None
        if op == "result" and not reason:
            state, values = TrialState.COMPLETE, outcome["values"]
        elif op == "pruned" and not reason:
            state = TrialState.PRUNED
        with self._lock:
            for key, value in attrs.items():
                trial.set_user_attr(key, value)
            if state == TrialState.FAIL:
                self._keep_log(trial, active.launched.log_path)
            try:
                frozen = self.study.tell(trial, values, state=state)
            except Exception as exc:  # e.g. a value of the wrong shape: the trial fails, the sweep goes on
                trial.set_user_attr(ATTR + "fail_reason", f"could not record the result: {exc}")
                frozen = self.study.tell(trial, state=TrialState.FAIL)
        option = active.scheduled.assignment.option
        if frozen.state == TrialState.COMPLETE:
            self._estimator.observe(option, end - active.start)
        measured = self._options.get(trial.number)
        record = measured.records.get(option.choice) if measured else None
        if frozen.state != TrialState.FAIL and record is not None and session.step_seconds is not None:
            # a pruned trial's loop ran at its real rate too
            self._estimator.observe_step_rate(record.step_seconds, session.step_seconds)
            if self._profiler is not None and session.step >= min(session.total_steps or 0, 10):
                self._profiler.observe_run(record.key, session.step_seconds)
        self._log_finished(frozen, end - active.start, reason, active.launched.log_path)
        self._notify("on_trial_end", frozen, end)

    def _attrs(self, active: _Active, end: float) -> dict[str, Any]:
        option = active.scheduled.assignment.option
        session = active.session
        attrs: dict[str, Any] = {
            "strategy": option.strategy,
            "num_devices": option.devices,
            "gradient_accumulation": option.gradient_accumulation,
            "devices": [str(self.settings.devices[i]) for i in active.devices],
            "device_ids": list(active.devices),
            "planned_start": round(active.scheduled.planned_start, 3),
            "planned_end": round(active.scheduled.planned_end, 3),
            "planned_runtime": round(option.runtime, 3),
            "actual_start": round(active.start, 3),
            "actual_end": round(end, 3),
            "actual_runtime": round(end - active.start, 3),
            "sweep_started_at": self._start,
            "pool": [str(d) for d in self.settings.devices],
            "log": str(active.launched.log_path),
        }
        if session.first_step_at is not None:
            attrs["first_step"] = round(session.first_step_at - self._start, 3)
        if session.step_seconds is not None:
            attrs["step_seconds"] = round(session.step_seconds, 5)
        return {ATTR + k: v for k, v in attrs.items()}

    def _keep_log(self, trial: optuna.Trial, log_path: Path) -> None:
        if self.settings.artifact_store is None or not log_path.exists():
            return
        from optuna.artifacts import upload_artifact

        artifact_id = upload_artifact(
            artifact_store=self.settings.artifact_store, file_path=str(log_path), study_or_trial=trial,
            mimetype="text/plain",
        )
        trial.set_user_attr(ATTR + "log_artifact_id", artifact_id)

    def _abort(self, runner: LocalRunner, server: ChannelServer, reason: str) -> None:
        """Stop every process, then end every trial this sweep holds in a clear state."""
        _logger.warning(f"Stopping the sweep: {reason}. Stopping {len(self._active)} running trial(s).")
        runner.stop_all()
        for number in list(self._active):
            self._finish(self._active.pop(number), None, server, reason=f"sweep stopped: {reason}")
        unstarted = [s.trial for s in self._pending] + self._waiting
        self._pending.clear()
        self._waiting = []
        with self._lock:
            for trial in unstarted:
                trial.set_user_attr(ATTR + "fail_reason", f"not started: sweep stopped: {reason}")
                self.study.tell(trial, state=TrialState.FAIL)

    # -- output -----------------------------------------------------------------------------------------------------
    def _log_finished(self, frozen: optuna.trial.FrozenTrial, seconds: float, reason: str, log: Path) -> None:
        if frozen.state == TrialState.COMPLETE:
            _logger.info(f"Trial {frozen.number} finished in {seconds:.1f} s with value(s) {frozen.values}.")
        elif frozen.state == TrialState.PRUNED:
            _logger.info(f"Trial {frozen.number} pruned after {seconds:.1f} s.")
        else:
            _logger.warning(f"Trial {frozen.number} failed after {seconds:.1f} s: {reason}\n{_tail(log)}")

    def _log_summary(self) -> None:
        wall = self._elapsed()
        stats = {
            "started_at": self._start, "wall_seconds": round(wall, 3), "trials": self._asked,
            "profiling_runs": self._profile_runs, "profiling_wall_seconds": round(self._profile_wall, 3),
            "profiling_device_seconds": round(self._profile_seconds, 3),
        }
        with self._lock:
            self.study.set_user_attr(ATTR + "last_sweep", stats)
        profiling = (
            f" ({self._profile_runs} profiling runs; batches waited {self._profile_wall:.1f} s for profiles)"
            if self._profile_runs else ""
        )
        _logger.info(f"Sweep finished in {wall:.1f} s{profiling}; logs in {self._run_dir}.")


def _first_rank_error(spec_path: str) -> str | None:
    """The error of the rank that failed first: its peers' errors are usually just "connection closed"."""
    errors = []
    for path in glob.glob(glob.escape(spec_path) + ".rank*.error.json"):
        with open(path, encoding="utf-8") as f:
            errors.append(json.load(f))
    if not errors:
        return None
    first = min(errors, key=lambda e: e["time"])
    return f"rank {first['rank']}: {first['error']}"


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    " + line for line in lines[-_LOG_TAIL_LINES:])


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _accumulation_note(gradient_accumulation: int) -> str:
    return f", {gradient_accumulation} micro-batches per step" if gradient_accumulation > 1 else ""
