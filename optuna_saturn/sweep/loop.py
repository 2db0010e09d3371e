"""One call of :meth:`SaturnExecutor.optimize` (or of the simulator): the loop.

It waits on the pool, routes each event to the policies (:mod:`~optuna_saturn.sweep.asking`, ``planning``,
``dispatch``, ``profiling``, ``faults``, ``elastic``, ``outcomes``; ``options`` is their view of the trials), and
has their decisions carried out (:mod:`~optuna_saturn.sweep.actions`). Only the loop and its actions talk to the
pool and to the study, and time comes from the clock it is given: wall time in a real sweep, virtual time in a
simulated one, where the same loop runs on a simulated pool.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from optuna_saturn.clock import Clock
from optuna_saturn.pools.protocol import JobEnd, Pool
from optuna_saturn.study.liveness import Heartbeat, HeartbeatWatch
from optuna_saturn.study.outbox import STORAGE_ERRORS
from optuna_saturn.study.ownership import RECOVER_SECONDS, recovery_round
from optuna_saturn.sweep import dispatch, reporting
from optuna_saturn.sweep.actions import Actions
from optuna_saturn.sweep.admission import Admission
from optuna_saturn.sweep.asking import Asking
from optuna_saturn.sweep.elastic import Elastic
from optuna_saturn.sweep.faults import Faults, failure_kind
from optuna_saturn.sweep.options import OptionsView
from optuna_saturn.sweep.outcomes import Outcomes
from optuna_saturn.sweep.planning import Planning
from optuna_saturn.sweep.profiling import Profiling
from optuna_saturn.sweep.settings import SweepSettings
from optuna_saturn.sweep.state import ProfileRun, SweepState, TrialRun
from optuna_saturn.worker.failures import OUT_OF_MEMORY

_logger = optuna.logging.get_logger("optuna.saturn")


class Sweep:
    def __init__(
        self,
        settings: SweepSettings,
        study: optuna.Study,
        *,
        pool: Pool,
        clock: Clock,
        pricing: Callable[[threading.Lock], Any] | None,
        n_trials: int | None,
        timeout: float | None,
        batch_size: int,
        callbacks: Sequence[Callable[[optuna.Study, FrozenTrial], None]] = (),
        gc_after_trial: bool = False,
        run_dir: Path | None = None,
    ) -> None:
        self.settings, self.study, self._pool, self._clock = settings, study, pool, clock
        self._state = state = SweepState(clock.now(), list(settings.devices), n_trials=n_trials)
        self._called_back = bool(callbacks)
        self._do = Actions.for_sweep(
            settings,
            study,
            state,
            pool=pool,
            clock=clock,
            run_dir=run_dir,
            callbacks=callbacks,
            gc_after_trial=gc_after_trial,
        )
        self._gateway, self._queue = self._do.gateway, self._do.queue
        # what prices trials (describes them under the study's lock); None: runtime estimates alone
        pricer = pricing(self._gateway.lock) if pricing is not None else None
        self._view = OptionsView.for_sweep(settings, study, state.largest_node)
        self._asking = Asking.for_sweep(settings, timeout=timeout, lookahead=batch_size, describes=pricer is not None)
        self._planning = Planning(settings)
        self._profiling = Profiling(pricer, budget=settings.profile_budget, profile_only=settings.profile_only)
        self._faults = Faults.for_sweep(settings, may_leave_out=pricer is not None, taken_over=self._gateway.taken_over)
        self._elastic = Elastic(
            enabled=settings.elastic and not settings.profile_only,
            max_moves=settings.max_moves,
            engines={s.name: s.engine for s in settings.strategies},
            seed=settings.seed,
            plan_work=settings.plan_work,
        )
        self._outcomes = Outcomes(node_of=pool.node_of)
        self._do.use(pricer=pricer, view=self._view, profiling=self._profiling)
        self._planning_seconds = 0.0
        self._next_recovery = float("-inf")
        self._watch = HeartbeatWatch()  # (on the machine's clock: other sweeps' heartbeats change in real time)
        self._admission = Admission(state, self._asking, self._view, self._do, now=self._now, plan=self._plan)

    def _now(self) -> float:
        """Seconds since the sweep started, on its clock."""
        return self._clock.now() - self._state.started_at

    # -- the loop ---------------------------------------------------------------------------------------------------
    def run(self) -> None:
        self._recover()
        self._do.events.send("on_sweep_start", [str(d) for d in self.settings.devices], self._state.started_at)
        with Heartbeat(self._gateway, self._do.owner.sweep) if self.settings.owned else contextlib.nullcontext():
            try:
                self._pool.start()
                while self._step():
                    pass
            except BaseException as exc:
                reason = "interrupted (KeyboardInterrupt)" if isinstance(exc, KeyboardInterrupt) else repr(exc)
                self._abort(reason)
                self._do.events.send("on_sweep_end", self._now(), True)
                raise
            finally:
                self._pool.close()
        summary = reporting.summary(
            self._state, self._now(), self._asking, self._planning_seconds, self._planning, self._profiling
        )
        self._gateway.set_study_attr("last_sweep", summary)
        _logger.info(f"Sweep finished in {self._now():.1f} s; logs in {self._do.run_dir}.")
        self._do.events.send("on_sweep_end", self._now(), False)

    def _step(self) -> bool:
        """One round: what ended, what the pool's nodes did, then every policy's decisions. False at the end."""
        state, do = self._state, self._do
        idle = not (state.waiting or state.running) and self._admission.may_ask()  # (the first trial)
        wait = 0.0 if idle else 0.05 if state.waiting and not state.running else 0.25
        ends = self._pool.wait(wait)
        ended_at = self._now()
        ended = state.ended(ends, ended_at)
        try:  # (with callbacks, each end is told first: a callback may stop the study, as in study.optimize)
            if not self._called_back and dispatch.before_telling(ended):
                for start in dispatch.starts(state, self._pool.ready(), self._view, self._now()):
                    do.start(start, self._now())
        finally:  # (what ended is told whatever a start did: its result is never lost to it)
            self._ended(ended, ended_at)
        ready = self._pool.ready()
        if state.note_ready(ready, self._now()):  # (every worker is up, for the first time)
            do.events.send("on_workers_ready", self._now())
        self._nodes()
        for start in dispatch.starts(state, ready, self._view, self._now()):
            do.start(start, self._now())
        self._admission.ask()
        if self._planning.due(state, self._pool.ready()):
            self._plan()
            for start in dispatch.starts(state, self._pool.ready(), self._view, self._now()):
                do.start(start, self._now())
        self._asking.note_the_first_round(state)
        do.request_move(self._elastic.move(state, self._view, self._now()))
        for measure in self._profiling.measurements(
            state, self._pool.ready(), self._view, self._planning.version, self._now()
        ):
            do.measure(measure, self._now())
        for run in state.trial_runs():
            do.relay_progress(run)
        do.learn_early(self._outcomes.early_lessons(state))
        for stop in self._faults.stalled(state, self._now()):
            do.stop(stop)
        self._recover()
        if self._asking.stopped(state, self._now(), self._gateway.stop_requested):
            for number in self._asking.not_to_start(state, self._pool.ready(), self._now()):
                state.forget(number)
                _logger.info(f"Trial {number} was not started before the sweep stopped asking: it stays queued.")
        more = self._profiling.pending if self.settings.profile_only else bool(state.waiting)
        return bool(more or state.running or self._admission.may_ask())

    def _recover(self) -> None:
        """At the start, and every :data:`RECOVER_SECONDS` after: the trials of sweeps on the study that died end
        FAIL and run again here (ahead of new trials; ``n_trials`` counts new trials)."""
        if not self.settings.owned or self._clock.now() < self._next_recovery:
            return
        self._next_recovery = self._clock.now() + RECOVER_SECONDS
        owner, retries = self._do.owner, self.settings.max_retries
        retried = recovery_round(self._gateway, owner, max_retries=retries, watch=self._watch)
        if retried:
            self._queue.look_again()
            if self._state.n_trials is not None:
                self._state.n_trials += len(retried)

    def _plan(self) -> None:
        began = self._clock.now()
        self._do.planned(self._planning.plan(self._state, self._view, self._now()))
        self._planning_seconds += self._clock.now() - began

    # -- ends -------------------------------------------------------------------------------------------------------
    def _ended(self, ended: Sequence[tuple[TrialRun | ProfileRun, JobEnd]], at: float) -> None:
        """``at``: when the loop saw them end (before it started the next trials, which may have come first)."""
        taught: int | bool | None = False  # the trial whose run taught the pricing (None: a profiling job)
        for index, (run, end) in enumerate(ended):
            try:
                self._elastic.job_ended()
                if isinstance(run, ProfileRun):
                    self._do.profile_ended(run, end, self._now())
                    taught = None
                elif self._trial_ended(run, end, at=at):
                    taught = run.number
            except BaseException:  # (a callback stopped the sweep: the ends not told yet are the abort's to end)
                self._state.running.update((later.key, later) for later, _ in ended[index + 1 :])
                raise
        if taught is not False:  # measurements came in: every waiting trial is priced again
            self._do.reprice(taught)

    def _trial_ended(
        self, run: TrialRun, end: JobEnd, *, reason: str = "", call_back: bool = True, at: float | None = None
    ) -> bool:
        """Whether the run taught the pricing something (then the waiting trials are priced again)."""
        self._do.relay_progress(run)  # the last steps of a short trial land between two relays
        op = (run.session.outcome or {}).get("op")
        if not reason:
            if failure_kind(run, end) == OUT_OF_MEMORY and self._do.describe_late(run):
                self._asking.describe_from_now()  # (more micro-batches may fit: that takes a description)
            left = self._faults.left_out(run, end)
            if left is not None and self._do.leave_out(left):
                return True  # an option left out for its workload
            if op == "moved":
                self._do.continue_moved(run, self._now())
                return True
        run_again = not reason and self._faults.run_again(run, end)
        tell = self._outcomes.tell(
            run,
            end,
            self._state,
            self._now() if at is None else at,
            run_again=run_again,
            reason=reason,
            profiling=self._profiling.where.get(run.number),
        )
        return self._do.tell(tell, call_back=call_back)

    def _nodes(self) -> None:
        """Devices of nodes that joined are planned on; those of nodes that died are not, nor the trials no node
        left can hold."""
        if self._do.nodes(self._pool.joined(), self._pool.lost(), self._now()):
            for fail in self._faults.without_a_node(self._state):
                self._do.fail(fail, self._now())

    def _abort(self, reason: str) -> None:
        """Stop every process, then end every trial this sweep holds in a clear state."""
        runs = self._state.trial_runs()
        _logger.warning(f"Stopping the sweep: {reason}. Stopping {len(runs)} running trial(s).")
        self._pool.close()
        try:
            for run in runs:
                stopped = JobEnd(run.key, run.devices, False, "stopped")
                self._trial_ended(run, stopped, reason=f"sweep stopped: {reason}", call_back=False)
            for waiting in self._state.waiting.values():
                if not waiting.queued:  # (a queued one is still in the queue: the next optimize runs it)
                    self._gateway.fail(waiting.trial, f"not started: sweep stopped: {reason}")
        except STORAGE_ERRORS:  # (what it could not tell is in the outbox: the next sweep tells it)
            _logger.exception("The storage failed while the sweep stopped; the next optimize ends its trials.")
        self._state.running.clear()
        self._state.waiting.clear()
