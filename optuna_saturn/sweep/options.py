"""The options policy: each waiting trial's options as the planner sees them, and what running jobs still need.

A trial's price (:class:`~optuna_saturn.pricing.prices.TrialPrice`) says what each option would take, measured or
predicted. The planner sees it corrected three ways:

- by what the sweep observed: a profile's timed steps are corrected by how real trials' loops ran against theirs
  (evaluation passes and checkpoints inside the loop included);
- by where the trial resumes: a trial run again from its checkpoint has only its steps after it left;
- by the pruner: a trial is priced at the share of its steps it is expected to run
  (:mod:`optuna_saturn.pricing.survival`), and a running one at what it is expected to run past where it is;
  planning to the next rung, a trial more likely pruned at its next rung than not is offered only its most
  efficient options (it should not hold devices a likely survivor needs), and one that survives the rung has all
  of them again (so the elastic policy may grow it onto devices that pruned trials freed);
- by caution and efficiency: an option nobody measured is weighed as if it took a share of its uncertainty
  longer (whether to measure it is the profiling policy's call), and among options that finish the plan equally
  soon the one that spends fewer device-seconds is preferred.

It also stands in for the trials not asked yet (future jobs), so that a trial asked alone does not take every
device when the trials still to come would use them better, and so that a deadline or a budget counts them.
"""

from __future__ import annotations

import bisect
from dataclasses import replace

import optuna
from optuna.trial import TrialState

from optuna_saturn.planner import Job, Option, Reservation
from optuna_saturn.pricing.survival import Survival
from optuna_saturn.pricing.unprofiled import RuntimeEstimator
from optuna_saturn.sweep.measuring import MeasuringTimes
from optuna_saturn.sweep.settings import SweepSettings
from optuna_saturn.sweep.state import ProfileRun, SweepState, TrialRun, Waiting
from optuna_saturn.sweep.weighing import fitting, most_efficient, standing_for, tie_broken, weighed

#: How many trials not asked yet the planner expects (per device, at most): enough to see that more work comes ...
FUTURE_TRIALS = 4
#: ... and under a deadline or a budget, which the whole sweep must meet: every trial ``n_trials`` will ask, up to this.
FUTURE_TRIALS_TO_MEET = 32
FUTURE = "future-"
_logger = optuna.logging.get_logger("optuna.saturn")
_Views = tuple[list[Option], list[Option], Job, tuple[float, int]]  # a trial's views: see OptionsView._view


class OptionsView:
    """The planner's view of the sweep's trials. Its memory, written by its own methods only: ``estimator``, what
    finished runs taught (:meth:`ended`); ``survival``, how much of their steps trials run under the study's pruner
    (learned the same way; default: pruning-blind), and whether each is planned to its next rung (see above)."""

    @classmethod
    def for_sweep(cls, settings: SweepSettings, study: optuna.Study, largest_node: int) -> OptionsView:
        blind = not (settings.plan_for_pruning or settings.plan_to_next_rung)
        survival = Survival.of_study(study, blind=blind, to_next_rung=settings.plan_to_next_rung)
        future = FUTURE_TRIALS_TO_MEET if settings.goal.whole_sweep else FUTURE_TRIALS
        estimator = RuntimeEstimator(settings.strategies, largest_node)
        return cls(estimator, profile_steps=settings.profile_steps, survival=survival, future_trials=future)

    def __init__(
        self,
        estimator: RuntimeEstimator,
        *,
        profile_steps: tuple[int, int],
        survival: Survival | None = None,
        future_trials: int = FUTURE_TRIALS,
    ) -> None:
        self.estimator, self._future_trials = estimator, future_trials
        self.survival = survival if survival is not None else Survival(None)
        self.measuring = MeasuringTimes(profile_steps)
        # every admitted trial's weighed options, as first priced, by their least device-seconds
        self._seen: list[tuple[float, int, list[Option]]] = []
        self._views: dict[int, tuple[tuple, list[Option], list[Option], Job, tuple[float, int]]] = {}  # key, views

    def ended(self, run: TrialRun, state: TrialState, seconds: float) -> None:
        """A run ended as ``state`` after ``seconds``: it teaches the estimates (runtime, step rate) and, under a
        pruner, how much of their steps trials run."""
        option, session = run.assignment.option, run.session
        priced = run.waiting.price.option(option.choice)
        if state == TrialState.COMPLETE and not session.resumed_from:
            self.estimator.observe(option, seconds)
        if state != TrialState.FAIL and priced and priced.record and session.step_seconds is not None:
            self.estimator.observe_step_rate(priced.record.step_seconds, session.step_seconds)
        ended, complete = state in (TrialState.COMPLETE, TrialState.PRUNED), state == TrialState.COMPLETE
        if ended and self.survival.saw_run(session.step, session.total_steps or 0, complete=complete):
            _logger.info(f"Trials are now {self.survival.describe()}.")

    def saw(self, waiting: Waiting) -> None:
        """A trial was admitted: it stands for the trials to come."""
        options = standing_for(waiting.price)
        if options:
            bisect.insort(self._seen, (min(o.runtime * o.devices for o in options), len(self._seen), options))

    def options(
        self, waiting: Waiting, state: SweepState, *, progress: float | None = None, keep: tuple | None = None
    ) -> list[Option]:
        """The options with their corrected runtimes (profiles corrected by real runs, resumed steps only);
        ``progress``: the share of its steps a running trial has run (which rung is its next), ``keep``: its
        option, offered whatever its next rung."""
        return self._view(waiting, state, progress, keep)[0]

    def weighed_options(self, waiting: Waiting, state: SweepState) -> list[Option]:
        return self._view(waiting, state)[1]

    def planned_job(self, waiting: Waiting, state: SweepState) -> Job:
        """The trial as the planner sees it: its options weighed, tie-broken, and fitting a node."""
        return self._view(waiting, state)[2]

    def quickest(self, waiting: Waiting, state: SweepState) -> tuple[float, int]:
        """Its fastest weighed runtime and its fewest devices: what any option of it takes at least."""
        return self._view(waiting, state)[3]

    def _view(
        self, waiting: Waiting, state: SweepState, progress: float | None = None, keep: tuple | None = None
    ) -> _Views:
        """(corrected options, weighed options, the planner's job, the quickest), computed again only when what
        they depend on changed (the trial's price, the checkpoint it resumes from, the observed step rates, the
        nodes): a large sweep asks for them at every event, for hundreds of trials."""
        resume = state.resumes.get(waiting.number)
        workload = waiting.price.workload
        total = workload.total_steps if workload is not None else 0
        reached = resume.step / total if resume is not None and total else 0.0
        expected = round(self.survival.expected_share(reached), 2)  # (rounded: views change when it does)
        stopping = self.survival.likely_stopped(reached if progress is None else progress)
        cached = self._views.get(waiting.number)
        if cached is not None:
            price, resumed, corrects, version, largest, share, stopped, kept = cached[0]
            same = (largest, share, stopped, kept) == (state.largest_node, expected, stopping, keep)
            same = same and price is waiting.price and resumed is resume
            if same and (not corrects or version == self.estimator.version):
                return cached[1:]
        corrects = any(p.record is not None and not p.record.observed for p in waiting.price.options)
        key = (waiting.price, resume, corrects, self.estimator.version, state.largest_node, expected, stopping, keep)
        corrected: list[Option] = []
        for priced in waiting.price.options:
            option, record = priced.option, priced.record
            if record is not None and record.step_seconds is not None and not record.observed and workload is not None:
                loop_seconds = record.trial_steps(workload.total_steps) * record.step_seconds
                option = replace(option, runtime=self.estimator.corrected(option.runtime, loop_seconds))
            left = 1.0 - reached  # its steps after the checkpoint, of which it is expected to run a share
            option = replace(option, runtime=max(option.runtime * left * expected, 1e-3))
            corrected.append(option)
        weighed_ = weighed(corrected, waiting.price.options)
        if stopping:  # (likely pruned at its next rung: no devices a likely survivor needs)
            kept = {o.choice for o in most_efficient(weighed_, state.largest_node)} | ({keep} if keep else set())
            corrected, weighed_ = ([o for o in options if o.choice in kept] for options in (corrected, weighed_))
        job = Job(str(waiting.number), tie_broken(fitting(weighed_, state.largest_node)))
        quickest = (min(o.runtime for o in weighed_), min(o.devices for o in weighed_))
        self._views[waiting.number] = (key, corrected, weighed_, job, quickest)
        return corrected, weighed_, job, quickest

    def jobs_and_busy(
        self, state: SweepState, now: float, *, future: bool = True
    ) -> tuple[list[Job], list[Reservation]]:
        """The waiting trials (and the future ones) as planner jobs, and the running jobs as reservations."""
        jobs = [self.planned_job(w, state) for w in state.waiting.values()]
        busy = [
            state.topology.reservation(r.devices, self.remaining(r, state, now), r.key)
            for r in state.running.values()
            if not set(r.devices) & state.lost
        ]
        return (jobs + self.future_jobs(state) if future else jobs), busy

    def future_jobs(self, state: SweepState, *, like: list[Option] | None = None) -> list[Job]:
        """The trials not asked yet, each like an asked trial of median size (or ``like`` these options): as many
        as make the trials planned ``FUTURE_TRIALS`` per device in all, ``FUTURE_TRIALS_TO_MEET`` under a deadline
        or a budget (none once ``n_trials`` are in, or when that many are known)."""
        per_device = self._future_trials
        remaining = (
            (state.n_trials - state.asked - state.queued_waiting()) if state.n_trials is not None else per_device
        )
        count = min(remaining, per_device * (len(state.devices) - len(state.gone)) - len(state.waiting))
        if like is None and self._seen:
            like = self._seen[len(self._seen) // 2][2]
        if not like or count <= 0:
            return []
        share = self.survival.expected_share()
        median = [replace(o, runtime=o.runtime * share) for o in like]
        if self.survival.likely_stopped():  # (as a trial asked now would be)
            median = most_efficient(median, state.largest_node)
        options = tie_broken(fitting(median, state.largest_node))
        return [Job(f"{FUTURE}{i}", options) for i in range(count)] if options else []

    def remaining(self, run: TrialRun | ProfileRun, state: SweepState, now: float) -> float:
        """Seconds a running job still needs: a trial from its measured step rate when it reports one (plus what
        its profile says follows the loop), else from its planned runtime; a profiling job from its prediction."""
        if isinstance(run, ProfileRun):
            return max(0.0, run.started + self.measuring.profile_seconds(run, state) - now)
        session, option = run.session, run.assignment.option
        priced = run.waiting.price.option(option.choice)
        record = priced.record if priced is not None else None
        if session.step_seconds is not None and session.total_steps:
            workload = run.waiting.price.workload
            after = record.after_loop_seconds if record is not None else 0.0
            expected = record.trial_steps(workload.total_steps) if record and workload else 0
            total = max(session.total_steps, expected)
            share = self.survival.expected_share(min(session.step / total, 1.0))  # (past where it is)
            return max(0.0, (total - session.step) * session.step_seconds) * share + after
        return max(0.0, run.started + option.runtime - now)
