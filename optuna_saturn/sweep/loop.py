"""One call of :meth:`SaturnExecutor.optimize` (or of the simulator): the loop.

It waits on the pool, routes each event to the policies (:mod:`~optuna_saturn.sweep.asking`, ``planning``,
``dispatch``, ``profiling``, ``faults``, ``elastic``, ``outcomes``; ``options`` is their view of the trials), and
has their decisions carried out (:mod:`~optuna_saturn.sweep.effects`). Only the loop and its effects talk to the
pool and to the study, and time comes from the clock it is given: wall time in a real sweep, virtual time in a
simulated one, where the same loop runs on a simulated pool. Its parts are built by
:func:`~optuna_saturn.sweep.assemble.assemble`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import optuna

from optuna_saturn.pools.protocol import JobEnd
from optuna_saturn.raised import rebuilt
from optuna_saturn.study.liveness import Heartbeat
from optuna_saturn.study.outbox import STORAGE_ERRORS
from optuna_saturn.study.ownership import RecoveryRounds
from optuna_saturn.study.queue import QueuedTrial
from optuna_saturn.sweep import dispatch, reporting
from optuna_saturn.sweep.asking import Next
from optuna_saturn.sweep.decisions import Admit
from optuna_saturn.sweep.effects import ends, intake, moves, prices
from optuna_saturn.sweep.parts import Parts
from optuna_saturn.sweep.state import ProfileRun, TrialRun

_logger = optuna.logging.get_logger("optuna.saturn")


class Sweep:
    def __init__(self, parts: Parts) -> None:
        self.settings, self._pool, self._clock = parts.settings, parts.pool, parts.clock
        self._state, self._effects, self._view = parts.state, parts.effects, parts.view
        self._asking, self._planning, self._profiling = parts.asking, parts.planning, parts.profiling
        self._faults, self._elastic, self._outcomes = parts.faults, parts.elastic, parts.outcomes
        self._releasing, self._world = parts.releasing, parts.effects.world
        self._do, self._gateway, self._called_back = self._effects.carry_out, self._world.gateway, parts.called_back
        self._planning_seconds = 0.0
        owner, retries = self._world.owner, self.settings.max_retries
        self._recoveries = RecoveryRounds(self._gateway, owner, max_retries=retries, clock=self._clock.now)

    def _now(self) -> float:
        """Seconds since the sweep started, on its clock."""
        return self._clock.now() - self._state.started_at

    # -- the loop ---------------------------------------------------------------------------------------------------
    def run(self) -> None:
        events = self._world.events
        self._recover()
        events.send("on_sweep_start", [str(d) for d in self.settings.devices], self._state.started_at)
        with Heartbeat(self._gateway, self._world.owner.sweep) if self.settings.owned else contextlib.nullcontext():
            try:
                self._pool.start()
                while self._step():
                    pass
            except BaseException as exc:
                reason = "interrupted (KeyboardInterrupt)" if isinstance(exc, KeyboardInterrupt) else repr(exc)
                self._abort(reason)
                events.send("on_sweep_end", self._now(), True)
                raise
            finally:
                self._pool.close()
        summary = reporting.summary(
            self._state, self._now(), self._asking, self._planning_seconds, self._planning, self._profiling
        )
        self._gateway.set_study_attr(
            "last_sweep", {**summary, **reporting.objective(self.settings.objective, self._state)}
        )
        _logger.info(f"Sweep finished in {self._now():.1f} s; logs in {self._world.requests.run_dir}.")
        events.send("on_sweep_end", self._now(), False)
        if self._state.raised is not None:  # (the objective's exception, as study.optimize raises it)
            raise rebuilt(self._state.raised)

    def _step(self) -> bool:
        """One round: what ended, what the pool's nodes did, then every policy's decisions. False at the end."""
        state = self._state
        idle = not (state.waiting or state.running) and self._may_ask()  # (the first trial)
        ends = self._pool.wait(0.0 if idle else 0.05 if state.waiting and not state.running else 0.25)
        ended_at = self._now()
        ended = state.ended(ends, ended_at)
        try:  # (with callbacks, each end is told first: a callback may stop the study, as in study.optimize)
            if not self._called_back and dispatch.before_telling(ended):
                self._dispatch()
        finally:  # (what ended is told whatever a start did: its result is never lost to it)
            self._ended(ended, ended_at)
        if state.note_ready(self._pool.ready(), self._now()):  # (every worker is up, for the first time)
            self._world.events.send("on_workers_ready", self._now())
        self._nodes()
        if self._planning.workers_came_up(state) and state.waiting:
            self._plan()
        self._dispatch()
        self._ask()
        if self._planning.due(state, self._pool.ready()):
            self._plan()
            self._dispatch()
        self._asking.note_the_first_round(state)
        asking_done, profiling = not self._may_ask(), self._profiling.pending
        if release := self._releasing.idle(state, asking_done=asking_done, profiling=profiling):
            self._do(release)
        if move := self._elastic.move(state, self._view, self._now()):
            self._do(move)
        ready, version = self._pool.ready(), self._planning.version
        for measure in self._profiling.measurements(state, ready, self._view, version, self._now()):
            self._do(measure)
        for run in state.trial_runs():
            reporting.relay_progress(self._world.events, run)
        taught = [learn.number for learn in self._outcomes.early_lessons(state) if self._do(learn)]
        for number in taught:
            prices.reprice(self._world, number)
        for stop in self._faults.stalled(state, self._now()):
            self._do(stop)
        self._recover()
        if self._asking.stopped(state, self._now(), self._gateway.stop_requested):
            for number in self._asking.not_to_start(state):
                state.forget(number)
                _logger.info(f"Trial {number} was not started before the sweep stopped asking: it stays queued.")
        more = self._profiling.pending if self.settings.profile_only else bool(state.waiting)
        return bool(more or state.running or self._may_ask())

    def while_describing(self) -> None:
        """While a trial is described (seconds, at the start), trials start on the workers that came up meanwhile."""
        if self._state.note_ready(ready := self._pool.ready(), self._now()):
            self._world.events.send("on_workers_ready", self._now())
        if self._planning.due(self._state, ready) and self._state.free() & ready:
            self._plan()
        self._dispatch()

    def _dispatch(self) -> None:
        for start in dispatch.starts(self._state, self._pool.ready(), self._view, self._now()):
            self._do(start)

    def _may_ask(self) -> bool:
        return self._asking.may_ask(self._state, self._now(), self._gateway.stop_requested)

    def _ask(self) -> None:
        """Take trials in while the asking policy says so: the queue's fixed ones described ahead, or asked."""
        while self._may_ask():
            taken = intake.describe_queued(self._world) if self._asking.room_to_describe(self._state) else None
            if taken is None:
                step = self._asking.next(self._state, self._now(), self._view)
                if step is None:
                    return
                if step is Next.PLAN_FIRST:  # (what waits changed: plan it, then look again)
                    self._plan()
                    continue
                if step is Next.PREVIEW:  # (a deadline no plan meets is refused before the study holds a trial)
                    preview = intake.preview(self._world)
                    self._do(self._planning.deadline_check(preview, self._state, self._view, self._now()))
                    continue
                taken = intake.ask(self._world, describe=self._asking.describes_asked)
            if taken.waiting is None:
                continue  # another sweep took it from the queue first
            self._asking.asked(taken.seconds)
            stop = self._outcomes.stop_on(taken.waiting.price.raised, taken.waiting.number)
            admitted = self._asking.admission(taken.waiting, stops=stop is not None)
            self._do(admitted)
            if stop:
                self._do(stop)
            if isinstance(admitted, Admit):
                self._view.saw(taken.waiting)
                if self._asking.profile_only:
                    self._profiling.measure_every_option(taken.waiting.trial, taken.waiting.price)

    def _recover(self) -> None:
        """At the start, then every :data:`RECOVER_SECONDS`: dead sweeps' trials end FAIL and run again here."""
        if retried := self._recoveries.due() if self.settings.owned else []:
            self._world.queue.look_again()
            self._state.runs_again(len(retried))

    def _plan(self) -> None:
        began = self._clock.now()
        planned = self._planning.plan(self._state, self._view, self._now())
        self._do(planned) if planned is not None else self._state.planned(None)
        self._planning_seconds += self._clock.now() - began

    # -- ends -------------------------------------------------------------------------------------------------------
    def _ended(self, ended: Sequence[tuple[TrialRun | ProfileRun, JobEnd]], at: float) -> None:
        """``at``: when the loop saw them end (before it started the next trials, which may have come first)."""
        taught: int | bool | None = False  # the trial whose run taught the prices (None: a profiling job)
        for index, (run, end) in enumerate(ended):
            try:
                self._elastic.job_ended()
                if isinstance(run, ProfileRun):
                    where = self._profiling.ran(run, self._now(), [str(self._state.devices[i]) for i in run.devices])
                    self._profiling.follow_up(prices.profile_ended(self._world, run, end, where))
                    taught = None
                elif self._trial_ended(run, end, at=at):
                    taught = run.number
            except BaseException:  # (a callback stopped the sweep: the ends not told yet are the abort's to end)
                self._state.running.update((later.key, later) for later, _ in ended[index + 1 :])
                raise
        if taught is not False:  # measurements came in: every waiting trial is priced again
            prices.reprice(self._world, taught)

    def _trial_ended(
        self, run: TrialRun, end: JobEnd, *, reason: str = "", call_back: bool = True, at: float | None = None
    ) -> bool:
        """Whether the run taught the prices something (then the waiting trials are priced again)."""
        reporting.relay_progress(self._world.events, run)  # the last steps of a short trial land between two relays
        if not reason:
            describe = self._faults.describe_late(run, end)
            if describe is not None:
                self._do(describe)
                self._asking.describe_from_now()  # (more micro-batches may fit: that takes a description)
            left = self._faults.left_out(run, end)
            readmit = left and self._faults.after_leaving_out(left, self._do(left))
            if readmit:
                self._do(readmit)
                return True  # an option left out for its workload
            if (run.session.outcome or {}).get("op") == "moved":
                self._do(self._elastic.moved(run, self._now(), self._state.started_at))
                return True
        run_again = not reason and self._faults.run_again(run, end)
        profiling = self._profiling.where.get(run.number)
        now = self._now() if at is None else at
        tell = self._outcomes.tell(run, end, self._state, now, run_again=run_again, reason=reason, profiling=profiling)
        frozen = ends.told(self._world, tell)
        if stop := self._outcomes.stop_after(run, frozen.state, run_again=run_again, reason=reason):
            self._do(stop)  # (and, as in study.optimize, the callbacks do not hear of the trial it raised in)
        self._view.ended(run, frozen.state, tell.attrs["actual_runtime"])
        taught = tell.learn is not None and self._do(tell.learn)
        ends.after_trial(self._world, frozen, tell.attrs["actual_end"], call_back=call_back and stop is None)
        return bool(taught)

    def _nodes(self) -> None:
        """Devices of nodes that joined are planned on; not those of nodes that died, nor trials none can hold."""
        if moves.nodes(self._world, self._pool.joined(), self._pool.lost()):
            self._do(self._planning.unplan_lost(self._state))
            for fail in self._faults.without_a_node(self._state):
                self._do(fail)

    def _abort(self, reason: str) -> None:
        """Stop every process, then end every trial this sweep holds in a clear state."""
        runs = self._state.trial_runs()
        _logger.warning(f"Stopping the sweep: {reason}. Stopping {len(runs)} running trial(s).")
        self._pool.close()
        try:
            for run in runs:
                stopped = JobEnd(run.key, run.devices, False, "stopped")
                self._trial_ended(run, stopped, reason=f"sweep stopped: {reason}", call_back=False)
            for waiting in self._state.waiting.values():  # (a queued one stays in the queue, for the next optimize)
                if not isinstance(waiting.trial, QueuedTrial):
                    self._gateway.fail(waiting.trial, f"not started: sweep stopped: {reason}")
        except STORAGE_ERRORS:  # (what it could not tell is in the outbox: the next sweep tells it)
            _logger.exception("The storage failed while the sweep stopped; the next optimize ends its trials.")
        self._state.abandoned()
