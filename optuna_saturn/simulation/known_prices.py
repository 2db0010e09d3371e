"""Prices in a simulated sweep: each trial is one of a known set of jobs, priced by that job's options.

The simulator runs the real loop on a simulated pool (:mod:`optuna_saturn.simulation.pool`); what the pricer of a
real sweep learns by describing and profiling trials is given here. Each job is enqueued in the simulated study
with its index as the fixed parameter ``job``; a trial is priced by the job it draws, and measuring one of its
options (a profiling job, or its own first run) makes that option measured. ``known_ahead=False`` makes every
trial sample its job (its queue entry cannot be described ahead), so trials arrive one by one, as a sampler's do;
``clairvoyant=True`` prices every option with its true runtime.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import optuna

from optuna_saturn.clock import VirtualClock
from optuna_saturn.planner import Job, Option
from optuna_saturn.pricing.prices import PricedOption, ProfileEntry, ProfileJob, TrialPrice
from optuna_saturn.profiler import ProfileRecord, Workload
from optuna_saturn.simulation.pool import Behaviour
from optuna_saturn.strategy import Strategy
from optuna_saturn.study.queue import ParameterNotFixed, QueuedTrial

#: The parameter that says which job a simulated trial is.
JOB_PARAMETER = "job"


@dataclass(frozen=True)
class SimulatedJob:
    """One job of a simulated sweep: what the sweep is told (``job``'s options), and what it really does."""

    job: Job
    behaviour: Behaviour
    measured: bool = True  # its options are measurements (else predictions, ``uncertainty`` off)
    uncertainty: float = 0.0
    describe_seconds: float = 0.0  # how long describing it takes the loop
    #: how its price changed in the sweep it replays: (the job whose run taught it, its options then), in order
    prices: tuple[tuple[int, tuple[Option, ...]], ...] = ()
    #: what its profiles are shared by (trials that differ in learning rate only, say); default: its name
    workload: str = ""

    @property
    def key(self) -> str:
        return self.workload or self.job.name


class KnownPrices:
    def __init__(
        self,
        jobs: Sequence[SimulatedJob],
        strategies: Sequence[Strategy],
        clock: VirtualClock,
        *,
        known_ahead: bool = True,
        clairvoyant: bool = False,
    ) -> None:
        self.jobs = list(jobs)
        self._strategies = {s.name: s for s in strategies}
        self._clock = clock
        self._known_ahead = known_ahead
        self._clairvoyant = clairvoyant
        self._job_of: dict[int, int] = {}  # trial number -> job index
        self._measured: set[tuple[str, tuple[str, int, int]]] = set()  # (workload, choice) measured in the sweep
        self._taught: set[int] = set()  # jobs whose runs taught the pricing (a replayed price changes after them)
        self._teachers = {taught for job in self.jobs for taught, _ in job.prices}
        self._left_out: set[tuple[int, tuple[str, int, int]]] = set()

    def job_index(self, number: int) -> int:
        return self._job_of[number]

    def behaviour(self, number: int) -> Behaviour:
        return self.jobs[self._job_of[number]].behaviour

    # -- what a pricer does -----------------------------------------------------------------------------------------
    def price(self, trial: optuna.Trial | QueuedTrial) -> TrialPrice:
        if isinstance(trial, QueuedTrial) and not self._known_ahead:
            raise ParameterNotFixed(JOB_PARAMETER)
        index = trial.suggest_int(JOB_PARAMETER, 0, len(self.jobs) - 1)
        known = self.jobs[index]
        if trial.number not in self._job_of:
            self._job_of[trial.number] = index
            self._clock.advance_by(known.describe_seconds)
        behaviour = known.behaviour
        price = TrialPrice(self._workload(index))
        options = known.job.options
        for taught, changed in known.prices:  # (a replay: the price it had once the runs that taught it ended)
            if taught in self._taught:
                options = list(changed)
        for option in options:
            choice = option.choice
            if (index, choice) in self._left_out:
                continue
            learned = (known.key, choice) in self._measured  # measured in this sweep: priced as it truly runs
            if self._clairvoyant or learned:
                runtime = behaviour.runtimes[choice] * (behaviour.prune_at if self._clairvoyant else 1.0)
                option = Option(option.strategy, option.devices, runtime, option.gradient_accumulation)
            measured = known.measured or learned or self._clairvoyant
            record = self._record(known, option) if measured else None
            price.options.append(
                PricedOption(
                    option,
                    f"{known.job.name}:{option.slug}",
                    record,
                    0.0 if measured else known.uncertainty,
                    "simulated",
                )
            )
        return price

    def profile_jobs(
        self, wanted: Sequence[tuple[optuna.Trial | optuna.trial.FixedTrial, tuple[str, int, int]]]
    ) -> list[ProfileJob]:
        """One job per (trial, device count, micro-batches): its strategies timed one after another."""
        groups: dict[tuple[int, int, int], list[Strategy]] = {}
        trials = {}
        for trial, (name, devices, accumulation) in wanted:
            trials[trial.number] = trial
            groups.setdefault((trial.number, devices, accumulation), []).append(self._strategies[name])
        return [
            ProfileJob(
                (ProfileEntry(trials[n], self._workload(self._job_of[n]), tuple(s), tuple(x.name for x in s)),),
                devices,
                accumulation,
            )
            for (n, devices, accumulation), s in groups.items()
        ]

    def record(
        self, job: ProfileJob, results: dict[int, list[dict]], started_at: float, unreported: dict | None = None
    ) -> list[tuple[ProfileEntry, Strategy, ProfileRecord | None]]:
        out = []
        for entry in job.entries:
            index = self._job_of[entry.trial.number]
            measured = {r["strategy"] for r in results.get(entry.trial.number, [])}
            known = self.jobs[index]
            for strategy in entry.strategies:
                choice = (strategy.name, job.devices, job.gradient_accumulation)
                record = None
                if strategy.name in measured and choice in known.behaviour.runtimes:
                    self._measured.add((known.key, choice))
                    record = self._record(
                        known,
                        Option(strategy.name, job.devices, known.behaviour.runtimes[choice], job.gradient_accumulation),
                    )
                out.append((entry, strategy, record))
        return out

    def follow_ups(self, job: ProfileJob, recorded: Sequence) -> list[ProfileJob]:
        return []

    def learn_from_run(self, number: int, option: Option, **_: object) -> bool:
        """A trial's run is its option's profile: priced from now on as measured. Returns whether that changes
        a price (it was not measured)."""
        index = self._job_of[number]
        self._taught.add(index)
        replayed = index in self._teachers
        known = self.jobs[index]
        if known.measured or (known.key, option.choice) in self._measured:
            return replayed
        self._measured.add((known.key, option.choice))
        return True

    def mark_failed(self, number: int, option: Option, error: str) -> None:
        self._left_out.add((self._job_of[number], option.choice))

    def mark_out_of_memory(self, number: int, option: Option, error: str) -> None:
        self.mark_failed(number, option, error)

    def workload(self, number: int) -> Workload | None:
        return self._workload(self._job_of[number]) if number in self._job_of else None

    def forget(self, number: int) -> None:
        self._job_of.pop(number, None)

    @property
    def prepares_nothing(self) -> bool:
        return False  # (every simulated job is described)

    def _workload(self, index: int) -> Workload:
        return Workload(self.jobs[index].job.name, 0, 0, "", self.jobs[index].behaviour.steps)

    @staticmethod
    def _record(known: SimulatedJob, option: Option) -> ProfileRecord:
        """A measured option as a profile: its true step rate (so no correction applies), no set-up of its own."""
        steps = max(known.behaviour.steps, 1)
        step = option.runtime / steps
        return ProfileRecord(
            key=f"{known.job.name}:{option.slug}",
            strategy=option.strategy,
            devices=option.devices,
            hardware="simulated",
            feasible=True,
            step_seconds=step,
            startup_seconds=0.0,
            tail_seconds=0.0,
            exit_seconds=0.0,
            observed_step_seconds=step,
            observed_runs=1,
            timed_steps=steps,
            gradient_accumulation=option.gradient_accumulation,
            loop_steps=[steps],
            peak_memory_bytes=0,
            measured_at=0.0,
        )
