"""One call of :meth:`SaturnExecutor.optimize` (or of the simulator): the loop.

It waits on the pool, hands each event to the hooks of every policy in its list (:mod:`~optuna_saturn.sweep.policy`:
a job's end, nodes lost, a trial taken in, the round), and has the decisions they return carried out
(:mod:`~optuna_saturn.sweep.effects`). Planning, dispatch and asking also say when it plans, what starts and when it
takes a trial in; ``options`` is the policies' view of the trials. Only the loop and its effects talk to the pool
and to the study, and time comes from the clock it is given: wall time in a real sweep, virtual time in a
simulated one, where the same loop runs on a simulated pool. Its parts are built by
:func:`~optuna_saturn.sweep.assemble.assemble`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import optuna

from optuna_saturn.pools.protocol import JobEnd, PoolBroken
from optuna_saturn.raised import rebuilt
from optuna_saturn.study.interrupts import Terminated, signals_held
from optuna_saturn.study.liveness import Heartbeat
from optuna_saturn.study.outbox import STORAGE_ERRORS
from optuna_saturn.study.ownership import RecoveryRounds
from optuna_saturn.study.ownership import run_again as queue_again
from optuna_saturn.study.queue import QueuedTrial
from optuna_saturn.sweep import dispatch, reporting
from optuna_saturn.sweep.asking import Next
from optuna_saturn.sweep.decisions import Reprice
from optuna_saturn.sweep.effects import intake, moves
from optuna_saturn.sweep.parts import Parts
from optuna_saturn.sweep.policy import Arrival, Ending, Round, carry_out_all
from optuna_saturn.sweep.state import ProfileRun, TrialRun

_logger = optuna.logging.get_logger("optuna.saturn")


class Sweep:
    def __init__(self, parts: Parts) -> None:
        self.settings, self._pool, self._clock = parts.settings, parts.pool, parts.clock
        self._state, self._effects, self._view = parts.state, parts.effects, parts.view
        self._asking, self._planning, self._profiling = parts.asking, parts.planning, parts.profiling
        self._policies, self._world = parts.policies, parts.effects.world
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
                # (SLURM's time limit, a pre-emption, every node gone: not the user's stop, nor the trials' fault)
                run_again = isinstance(exc, (Terminated, PoolBroken))
                if run_again:
                    reason = f"{'terminated' if isinstance(exc, Terminated) else 'the pool broke'} ({exc}): run again"
                self._abort(reason, run_again=run_again)
                events.send("on_sweep_end", self._now(), True)
                raise
            finally:
                self._pool.close()
        summary = reporting.summary(
            self._state, self._now(), self._asking, self._planning_seconds, self._planning, self._profiling
        )
        self._gateway.set_study_attr(
            "last_sweep", {**summary, **reporting.goal_report(self.settings.goal, self._state)}
        )
        _logger.info(f"Sweep finished in {self._now():.1f} s; logs in {self._world.requests.run_dir}.")
        events.send("on_sweep_end", self._now(), False)
        if self._state.raised is not None:  # (the objective's exception, as study.optimize raises it)
            raise rebuilt(self._state.raised)

    def _step(self) -> bool:
        """One round: what ended, what the pool's nodes did, then every policy's decisions. False at the end."""
        state = self._state
        idle = not (state.waiting or state.running) and self._may_ask()  # (the first trial)
        # (a stop signal waits until what ended is told whole, its retry queued: the abort sees only running ones)
        with signals_held():
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
        ready, stop_requested = self._pool.ready(), self._gateway.stop_requested
        round_ = Round(
            state, self._view, self._now(), ready, not self._may_ask(), self._profiling.pending, stop_requested
        )
        for policy in self._policies:  # (releasing, elastic moves, profiling jobs, stalls, early lessons, ...)
            carry_out_all(policy.on_round(round_), self._do)
        for run in state.trial_runs():
            reporting.relay_progress(self._world.events, run)
        self._recover()
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
            arrival = Arrival(taken.waiting, taken.seconds, self._state, self._view)
            for policy in self._policies:
                carry_out_all(policy.on_asked(arrival), self._do)

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
        taught: list[int | None] = []  # the runs that taught the prices (None: a profiling job)
        for index, (run, end) in enumerate(ended):
            try:
                if self._end(run, end, at=at):
                    taught.append(run.number if isinstance(run, TrialRun) else None)
            except BaseException:  # (a callback stopped the sweep: the ends not told yet are the abort's to end)
                self._state.running.update((later.key, later) for later, _ in ended[index + 1 :])
                raise
        if taught:  # measurements came in: every waiting trial is priced again
            self._do(Reprice(taught[-1]))

    def _end(
        self,
        run: TrialRun | ProfileRun,
        end: JobEnd,
        *,
        reason: str = "",
        call_back: bool = True,
        at: float | None = None,
        run_again: bool = False,
    ) -> bool:
        """The policies see the end in turn until one settles it; whether it taught the prices something.
        ``run_again``: the sweep's own stop queues the trial again (faults decide it for any other end)."""
        if isinstance(run, TrialRun):  # the last steps of a short trial land between two relays
            reporting.relay_progress(self._world.events, run)
        now = self._now()
        ending = Ending(run, end, self._state, self._view, now, now if at is None else at, reason, call_back, run_again)
        for policy in self._policies:
            carry_out_all(policy.on_end(ending), self._do)
            if ending.settled:
                return ending.taught
        raise RuntimeError(f"no policy settled the end of {run.key}: the sweep's policies need one that tells trials")

    def _nodes(self) -> None:
        """Devices of nodes that joined are planned on; not those of nodes that died, nor trials none can hold."""
        if moves.nodes(self._world, self._pool.joined(), self._pool.lost()):
            for policy in self._policies:
                carry_out_all(policy.on_nodes_lost(self._state), self._do)

    def _abort(self, reason: str, *, run_again: bool = False) -> None:
        """Stop every process, then end every trial this sweep holds in a clear state; ``run_again``: the running
        ones' params are queued again (within ``max_retries``), for the next optimize."""
        runs = self._state.trial_runs()
        _logger.warning(f"Stopping the sweep: {reason}. Stopping {len(runs)} running trial(s).")
        self._pool.close()
        try:
            for run in runs:
                stopped = JobEnd(run.key, run.devices, False, "stopped")
                again = run_again and run.waiting.retries < self.settings.max_retries
                self._end(run, stopped, reason=f"sweep stopped: {reason}", call_back=False, run_again=again)
            for waiting in self._state.waiting.values():  # (a queued one stays in the queue, for the next optimize)
                if not isinstance(waiting.trial, QueuedTrial):
                    frozen = self._gateway.fail(waiting.trial, f"not started: sweep stopped: {reason}")
                    if run_again:  # (its sampled params wait in the queue too: nothing the study asked is lost)
                        queue_again(self._gateway, frozen)
        except STORAGE_ERRORS:  # (what it could not tell is in the outbox: the next sweep tells it)
            _logger.exception("The storage failed while the sweep stopped; the next optimize ends its trials.")
        self._state.abandoned()
