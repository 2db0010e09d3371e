"""The asking policy: when the sweep takes on another trial, and when it stops.

No batch barrier: a trial is asked whenever a device would otherwise sit idle within the look-ahead (when the plan
leaves it free now, or within the time asking and describing a trial takes), and at most ``lookahead`` asked
trials wait at once. Asking no earlier than needed lets the sampler see as many finished trials as it can; asking
no later keeps devices busy. And never more trials are in flight (asked, not yet told) than there are devices:
the sampler then never sees more trials running than under plain Optuna's ``n_jobs`` (one thread per device, each
asking once its trial was told). So a trial is described ahead while a device runs only where trials take
several devices each, or while some device has none; where every device runs a trial, the next is asked once one
of them was told. Where a trial has nothing to choose (one option: ``single`` on one device) it needs
no description, so nothing is asked ahead: a trial is asked when a device is free, after the one that freed it
was told, exactly as plain Optuna's ``n_jobs`` threads ask (the sampler sees what it would see there), and runs
undescribed (its runtime is estimated from the trials that ended), until one runs out of memory: from then on
trials are described, so that each is planned with the micro-batches its workload needs.

Under a deadline, a trial of a copy of the study is priced first (:mod:`optuna_saturn.study.stand_in`).

Trials of the study's queue whose parameters are all fixed need no sampler: they are described ahead and planned
as a set, up to ``QUEUED_TRIALS_PER_DEVICE`` per device and ``MOST_QUEUED_TRIALS`` in all
(:mod:`optuna_saturn.study.queue`). A profile-only sweep asks all its trials at once.

Asking stops at ``n_trials`` (new trials; a trial run again adds one), at ``study.stop()``, or once the timeout
passed and every device had a trial: plain Optuna's ``n_jobs`` threads start their first trials within moments of
each other, so a short timeout still runs one per thread, while the sweep describes each trial first (seconds, for
a large model's imports); a timeout shorter than that must not leave devices without one.
"""

from __future__ import annotations

from enum import Enum

from optuna_saturn.study.queue import MOST_QUEUED_TRIALS, QUEUED_TRIALS_PER_DEVICE
from optuna_saturn.sweep.decisions import Admit, Fail
from optuna_saturn.sweep.options import OptionsView
from optuna_saturn.sweep.outcomes import Catch, stop_on
from optuna_saturn.sweep.policy import Arrival, Decisions, Ending, Policy, Round, Steps
from optuna_saturn.sweep.run_failures import out_of_memory_undescribed
from optuna_saturn.sweep.settings import SweepSettings
from optuna_saturn.sweep.state import SweepState, Waiting

#: Ask the next trial when a device will have nothing to do within twice the time asking and describing a trial
#: took lately, plus this margin: it is then planned before the device frees, and asked as late as that allows.
ASK_AHEAD_SECONDS = 0.1


class Next(Enum):
    ASK = "ask"  # take the queue's next trial, or ask a new one
    PLAN_FIRST = "plan first"  # what waits changed: plan it, then look again
    PREVIEW = "preview"  # under a deadline, before the first trial: plan on one the study never sees, to refuse


class Asking(Policy):
    """When to take a trial in (see the module's docstring). Its own memory, written by its own methods only: how
    long asking took, whether trials are described (:meth:`on_end`), the first round."""

    def __init__(
        self,
        *,
        timeout: float | None,
        lookahead: int,
        profile_only: bool,
        describe_ahead: bool,
        ask_ahead: bool = True,
        preview: bool = False,
        catch: Catch = (),
    ) -> None:
        self.timeout = timeout
        self.lookahead = lookahead
        self.profile_only = profile_only  # a profiling-only sweep: every option is measured
        self._describe_ahead = describe_ahead and not profile_only
        self._ask_ahead = ask_ahead  # False: only for a device that is free now, as plain Optuna's threads ask
        self.describes_asked = ask_ahead  # an asked trial is described before it is planned (else it runs as is)
        self._had_a_first_round = False
        self._preview_due = preview and not profile_only  # (see :meth:`next`)
        self._catch = catch  # the exceptions of the objective that end only their trial (study.optimize's catch)
        self.ask_seconds: list[float] = []  # how long asking and describing each trial took

    @classmethod
    def for_sweep(
        cls, settings: SweepSettings, *, timeout: float | None, lookahead: int, describes: bool, catch: Catch = ()
    ) -> Asking:
        """``describes``: the sweep can describe trials (it prices them). It asks ahead where it describes the
        trials it asks (describing is what asking ahead hides), and describes the queue's trials ahead unless
        nothing is to choose on one device (their order then cannot change when the sweep ends either)."""
        return cls(
            timeout=timeout,
            lookahead=lookahead,
            profile_only=settings.profile_only,
            describe_ahead=describes and (settings.describe_asked or len(settings.devices) > 1),
            ask_ahead=describes and settings.describe_asked,
            preview=settings.goal.refuses_first_miss,
            catch=catch,
        )

    def on_end(self, ending: Ending) -> Decisions:
        """A trial that ran undescribed ran out of memory: from now on trials are described, so that they are
        planned with the micro-batches their workload needs (they are still asked once a device is free)."""
        run = ending.trial_run
        if run is not None and not ending.reason and out_of_memory_undescribed(run, ending.end):
            self.describes_asked = True
        return []

    def on_asked(self, arrival: Arrival) -> Steps:
        """The trial waits to be planned, or fails; an exception it raised while described may stop the sweep."""
        waiting = arrival.waiting
        self.ask_seconds.append(arrival.seconds)
        stop = stop_on(waiting.price.raised, waiting.number, self._catch)
        admitted = self.admission(waiting, stops=stop is not None)
        yield admitted
        if stop is not None:
            yield stop
        if isinstance(admitted, Admit):
            arrival.admitted = True
            arrival.view.saw(waiting)

    def on_round(self, round: Round) -> Decisions:
        """Once every device had a trial, it stays had (a node that joins later reopens no asking)."""
        self._had_a_first_round = self._had_a_first_round or not self._first_round_due(round.state)
        return []

    def may_ask(self, state: SweepState, now: float, stop_requested: bool) -> bool:
        """Whether the sweep may take on another trial: asked, or described from the queue."""
        if state.n_trials is not None and state.asked + state.queued_waiting() >= state.n_trials:
            return False
        return not self.stopped(state, now, stop_requested)

    def stopped(self, state: SweepState, now: float, stop_requested: bool) -> bool:
        """``study.stop()`` (from a callback: the trials asked still run), or the timeout passed once every device
        had a trial (see the module's docstring)."""
        if stop_requested or state.raised is not None:  # (the objective raised what catch does not list)
            return True
        return self.timeout is not None and now >= self.timeout and not self._first_round_due(state)

    def room_to_describe(self, state: SweepState) -> bool:
        """Whether a trial of the queue may be described before it is asked (fewer known trials wait than
        ``QUEUED_TRIALS_PER_DEVICE`` per device allows, ``MOST_QUEUED_TRIALS`` in all)."""
        limit = max(self.lookahead, min(QUEUED_TRIALS_PER_DEVICE * len(state.devices), MOST_QUEUED_TRIALS))
        return self._describe_ahead and len(state.waiting) < limit

    def next(self, state: SweepState, now: float, options: OptionsView) -> Next | None:
        """Whether to ask a trial now: fewer than ``lookahead`` wait, and a device idles soon."""
        if self.profile_only:
            return Next.ASK if len(state.waiting) < (state.n_trials or 0) else None
        if len(state.waiting) >= self.lookahead or self._in_flight(state) >= self._slots(state):
            return None
        if state.plan_dirty:
            return Next.PLAN_FIRST
        preview, self._preview_due = self._preview_due and not (state.waiting or state.running or state.asked), False
        if preview:  # (once, before anything waits, runs or was asked)
            return Next.PREVIEW
        return Next.ASK if self._idle_soon(state, now, options) else None

    @staticmethod
    def _in_flight(state: SweepState) -> int:
        """Trials asked and not yet told: running, or waiting (not the queue's, which no sampler chose)."""
        return len(state.trial_runs()) + sum(not w.queued for w in state.waiting.values())

    @staticmethod
    def _slots(state: SweepState) -> int:
        """As many trials in flight as plain Optuna's ``n_jobs`` threads would hold: one per device, or ``n_jobs``."""
        return min(len(state.devices) - len(state.gone), state.n_jobs or len(state.devices))

    @staticmethod
    def admission(waiting: Waiting, *, stops: bool = False) -> Admit | Fail:
        """A trial asked and priced waits to be planned, or fails if no option fits it (or its objective exited or
        hung while it was described; ``stops``: it raised what stops the sweep, and no callback hears of it)."""
        if waiting.price.options:
            return Admit(waiting)
        if waiting.price.failure:
            return Fail(waiting, waiting.price.failure, call_back=not stops)
        return Fail(waiting, "no strategy fits this trial on these devices (every option ran out of memory or failed)")

    def _first_round_due(self, state: SweepState) -> bool:
        """Whether some device has yet to get its first trial: fewer trials than devices were asked (or described
        from the queue), and some device has none running or planned on it."""
        if self._had_a_first_round:
            return False
        devices = {d for members in state.topology.members for d in members}
        held = {d for run in state.running.values() for d in run.devices}
        held |= {d for w in state.waiting.values() if w.assignment is not None for d in w.assignment.devices}
        return state.asked + state.queued_waiting() < len(devices) and not devices <= held

    def _idle_soon(self, state: SweepState, now: float, options: OptionsView) -> bool:
        """Whether some device has nothing to do (no job, no trial planned on it) within asking's time."""
        recent = self.ask_seconds[-5:]
        horizon = ASK_AHEAD_SECONDS + 2 * max(recent) if recent and self._ask_ahead else 0.0
        busy_until = {d: now for m in state.topology.members for d in m}
        for run in state.running.values():
            remaining = options.remaining(run, state, now) if self._ask_ahead else float("inf")
            for d in set(run.devices) & busy_until.keys():
                busy_until[d] = max(busy_until[d], now + remaining)
        for waiting in state.waiting.values():
            if waiting.assignment is not None:
                for d in waiting.assignment.devices:
                    busy_until[d] = max(busy_until[d], waiting.planned_end)
        return min(busy_until.values()) <= now + horizon
