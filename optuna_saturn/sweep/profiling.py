"""The profiling policy: which options are worth measuring, and on which idle devices.

Measuring every option of every new workload costs more device time than it can save. An option nobody measured
is priced by the cost model, with an uncertainty; it is measured only where the value of information says the
plan could be shorter with what the measurement may show by more than the measurement costs
(:mod:`optuna_saturn.pricing.value_of_information`), judged once per plan, while devices idle. Profiling jobs run
only on devices the plan leaves idle now, within ``profile_budget`` device-seconds if one is set. A trial's first
real run under an option nobody measured is that option's profile (the outcomes policy learns from it).

A profile-only sweep measures every option of every trial it asks, and runs none.
"""

from __future__ import annotations

from dataclasses import replace

import optuna

from optuna_saturn.pricing.prices import ProfileJob, TrialPrice
from optuna_saturn.pricing.source import PriceSource
from optuna_saturn.pricing.value_of_information import profile_gain, worth_measuring
from optuna_saturn.sweep.decisions import Measure, Profiled
from optuna_saturn.sweep.options import OptionsView
from optuna_saturn.sweep.policy import Arrival, Decisions, Ending, Policy, Round, Steps
from optuna_saturn.sweep.state import ProfileRun, SweepState

_logger = optuna.logging.get_logger("optuna.saturn")


class Profiling(Policy):
    """Keeps the profiling jobs to run, and what was measured or is being measured: its own memory, written by its
    own methods only (:meth:`measure_every_option`, :meth:`follow_up`, :meth:`ran`, :meth:`measurements`)."""

    def __init__(self, pricer: PriceSource | None, *, budget: float | None, profile_only: bool) -> None:
        self._pricer = pricer  # groups the options to measure into jobs (None: nothing is ever measured)
        self._budget = budget
        self._profile_only = profile_only
        self._queue: list[ProfileJob] = []
        # grouped into jobs when placed
        self._every_option: list[tuple[optuna.Trial | optuna.trial.FixedTrial, tuple[str, int, int]]] = []
        self._profiled: set[tuple[int, tuple[str, int, int]]] = set()  # (trial, choice) measured or measuring
        self._judged = -1  # the plan whose value of information was judged
        self.device_seconds = 0.0  # spent in profiling jobs
        self.runs = 0
        self.where: dict[int, list[dict]] = {}  # per trial: where and when its profiling jobs ran

    def on_end(self, ending: Ending) -> Steps:
        """A profiling job's end: its device time is spent, and what it did not reach is measured next. A trial's:
        where its options were measured, for its attributes."""
        run = ending.run
        if not isinstance(run, ProfileRun):
            ending.profiling = self.where.get(run.number)
            return
        where = self.ran(run, ending.now, [str(ending.state.devices[i]) for i in run.devices])
        self.follow_up((yield Profiled(run, ending.end, where)))
        ending.settle(taught=True)

    def on_asked(self, arrival: Arrival) -> Decisions:
        if arrival.admitted and self._profile_only:
            self.measure_every_option(arrival.waiting.trial, arrival.waiting.price)
        return []

    def on_round(self, round: Round) -> Decisions:
        return self.measurements(round.state, round.ready, round.view, round.state.plans, round.now)

    @property
    def pending(self) -> bool:
        return bool(self._queue or self._every_option)

    def measure_every_option(self, trial: optuna.Trial | optuna.trial.FixedTrial, price: TrialPrice) -> None:
        """A profile-only sweep's trial: all of its options not measured yet. The trials admitted together are
        grouped into jobs together (one job per device count times every strategy of every one of them)."""
        self._every_option += [(trial, p.option.choice) for p in price.options if not p.measured]

    def follow_up(self, jobs: list[ProfileJob]) -> None:
        """What a profiling job that stopped early did not reach, to run next."""
        self._queue += jobs

    def measurements(
        self, state: SweepState, ready: set[int], view: OptionsView, plan_version: int, now: float
    ) -> list[Measure]:
        """Profiling jobs to start now, each on idle devices."""
        if self._pricer is None:
            return []
        if self._every_option:
            self._queue += self._pricer.profile_jobs(self._every_option)
            self._every_option = []
        self._queue = [j for j in map(lambda job: _still_waiting(job, state), self._queue) if j is not None]
        idle = self._idle_devices(state, ready, now)
        if not self._profile_only and self._judged != plan_version and idle:
            self._judged = plan_version  # judged once per plan, when devices are idle
            self._queue += self._worth_measuring(state, view, now)
        decided = []
        while self._queue:
            if self._budget is not None and self.device_seconds >= self._budget:
                _logger.info(f"Profiling budget of {self._budget} device-seconds spent: the rest is predicted.")
                self._queue.clear()
                break
            placed = ((j, state.topology.pick(idle, j.devices)) for j in self._queue)
            job, devices = next(((j, d) for j, d in placed if d is not None), (None, None))
            if job is None or devices is None:  # (both None: no job fits)
                break
            self._queue.remove(job)
            idle -= set(devices)
            decided.append(Measure(job, tuple(devices)))
            for entry in job.entries:
                for s in entry.strategies:
                    self._profiled.add((entry.trial.number, (s.name, job.devices, job.gradient_accumulation)))
        return decided

    def ran(self, run: ProfileRun, now: float, device_names: list[str]) -> dict[int, list[dict]]:
        """A profiling job ended: its device time is spent. Returns, per trial it measured, where and when its
        profiling jobs ran (the schedule chart shows that time)."""
        self.device_seconds += (now - run.started) * len(run.devices)
        self.runs += 1
        for entry in run.job.entries:
            self.where.setdefault(entry.trial.number, []).append(
                {"option": run.job.name, "devices": device_names, "start": round(run.started, 3), "end": round(now, 3)}
            )
        return {e.trial.number: self.where[e.trial.number] for e in run.job.entries}

    def _idle_devices(self, state: SweepState, ready: set[int], now: float) -> set[int]:
        """Free, ready devices that no waiting trial is planned to start on now."""
        free = state.free() & ready
        if self._profile_only or not free:
            return free
        soon = {
            d
            for w in state.waiting.values()
            if w.assignment is not None and w.planned_start < now + 0.5
            for d in w.assignment.devices
        }
        return free - soon

    def _worth_measuring(self, state: SweepState, view: OptionsView, now: float) -> list[ProfileJob]:
        """Options of waiting trials whose measurement could shorten the plan by more than it costs."""
        candidates = [
            (number, waiting, priced)
            for number, waiting in state.waiting.items()
            for priced in waiting.price.options
            if not priced.measured and priced.uncertainty > 0 and (number, priced.option.choice) not in self._profiled
        ]
        if not candidates:
            return []
        jobs, busy = view.jobs_and_busy(state, now)
        wanted = []
        for number, waiting, priced in candidates:
            choice = priced.option.choice
            optimistic = priced.option.runtime / (1.0 + priced.uncertainty)
            gain = profile_gain(jobs, state.cluster, str(number), choice, optimistic, busy=busy)
            if gain <= 0:
                continue
            cost = view.measuring.measurement_seconds(waiting, priced)
            if worth_measuring(gain, cost, priced.option.devices, state.cluster):
                wanted.append((waiting.trial, choice))
                self._profiled.add((number, choice))
                _logger.info(
                    f"Measuring {priced.option.label} for trial {number}: it may save {gain:.1f} s of the plan "
                    f"for about {cost:.1f} s on {priced.option.devices} device(s)."
                )
        if self._pricer is None:  # (checked by measurements(), which alone calls this)
            return []
        return self._pricer.profile_jobs(wanted) if wanted else []


def _still_waiting(job: ProfileJob, state: SweepState) -> ProfileJob | None:
    """``job`` with only the trials that still wait: one that started measures its option by its own run."""
    entries = tuple(e for e in job.entries if e.trial.number in state.waiting)
    if len(entries) == len(job.entries):
        return job
    return replace(job, entries=entries) if entries else None
