"""The outcomes policy: what the study is told when a trial's run ends, and what the run teaches the pricing.

A run ends COMPLETE with its values, PRUNED, or FAIL with the reason in ``saturn:fail_reason``; its attributes
say where and how it ran (strategy, devices, node, planned and actual times, how it was priced), so that the
schedule chart, ``optuna-saturn report`` and the simulator can replay the sweep. A run that took enough steps is
its option's profile, or corrects it, for the trials priced after it.

A run under an option nobody measured for its workload teaches early: once it has taken
:data:`EARLY_LESSON_STEPS` steps, its step rate so far is that option's profile, so the trials waiting behind it
are priced from a real measurement while it runs, not from the prior until it ends (a cold sweep's first trial on
a GPU may run for hours). Its end then revises that profile with the whole run.
"""

from __future__ import annotations

from typing import Any

from optuna.trial import TrialState

from optuna_saturn.devices import Device
from optuna_saturn.pools.protocol import JobEnd
from optuna_saturn.raised import caught
from optuna_saturn.sweep.decisions import Learn, StopOnError, Tell
from optuna_saturn.sweep.state import SweepState, TrialRun

#: A run teaches its step rate once it took this many steps (or all of its steps, if it has fewer): a profiling run
#: times 5 after 2 of warm-up; the real run's rate also averages its first, slower steps in.
EARLY_LESSON_STEPS = 10


class Outcomes:
    """How a run's trial ends, and what it teaches. Its own memory: the trials that already taught early."""

    def __init__(self, *, catch: tuple[type[BaseException], ...] = ()) -> None:
        self._taught_early: set[int] = set()  # trials whose runs taught their step rate while running
        self._catch = catch  # the exceptions of the objective that end only their trial (study.optimize's catch)

    def stop_on(self, raised: dict | None, number: int) -> StopOnError | None:
        """Trial ``number`` ended FAIL on an exception its objective ``raised`` (None: it did not; a fault of the
        sweep's machinery, which the faults policy runs again, never is one): it stops the sweep, unless ``catch``
        lists it."""
        if raised is None or caught(raised, self._catch):
            return None
        return StopOnError(number, raised)

    def stop_after(self, run: TrialRun, told: TrialState, *, run_again: bool, reason: str) -> StopOnError | None:
        """:meth:`stop_on` for a run told ``told``: not one the sweep failed (``reason``) or runs again."""
        if told != TrialState.FAIL or run_again or reason:
            return None
        return self.stop_on((run.session.outcome or {}).get("raised"), run.number)

    def early_lessons(self, state: SweepState) -> list[Learn]:
        """Running trials whose option nobody measured for their workload, and which have now taken enough steps
        to measure it (see the module's docstring), each with what it teaches (once per trial)."""
        lessons = []
        for run in state.trial_runs():
            session = run.session
            if run.number in self._taught_early or session.step_seconds is None or session.resumed_from:
                continue
            if session.step < EARLY_LESSON_STEPS or session.step >= (session.total_steps or 0):
                continue  # (a run about to end teaches at its end)
            priced = run.waiting.price.option(run.assignment.option.choice)
            if priced is None or priced.measured:
                continue
            self._taught_early.add(run.number)
            option = run.assignment.option
            lessons.append(Learn(run.number, option, self._lesson(run, state, tail=None), early=True))
        return lessons

    def tell(
        self,
        run: TrialRun,
        end: JobEnd,
        state: SweepState,
        now: float,
        *,
        run_again: bool,
        reason: str = "",
        profiling: list[dict] | None = None,
    ) -> Tell:
        """How ``run``'s trial ends: ``reason`` (the sweep's) fails it whatever it said; ``run_again``: a rank
        died or hung, and the trial runs again."""
        outcome = run.session.outcome or {}
        op = outcome.get("op")
        reason = reason or run.stalled
        if not reason and op in ("fail", None):
            if op is None and not end.clean and "died" in end.reason:  # the death first: its peers' errors follow
                reason = f"{end.reason} before reporting a result" + (f" ({end.error})" if end.error else "")
            else:
                reason = end.error or f"the trial's workers ended ({end.reason or 'unknown'}) before reporting a result"
        trial_state, values = TrialState.FAIL, None
        if op == "result" and not reason:
            trial_state, values = TrialState.COMPLETE, outcome["values"]
        elif op == "pruned" and not reason:
            trial_state = TrialState.PRUNED
        attrs = self.attrs(run, state, now, profiling)
        if reason:
            attrs["fail_reason"] = reason
        learn = self._learned(run, state, trial_state)
        return Tell(run, trial_state, values, attrs, reason, run_again=run_again, learn=learn)

    def attrs(self, run: TrialRun, state: SweepState, now: float, profiling: list[dict] | None) -> dict[str, Any]:
        """``saturn:`` attributes of an ended run (see the module's docstring)."""
        waiting, session = run.waiting, run.session
        option = run.assignment.option
        priced = waiting.price.option(option.choice)
        attrs: dict[str, Any] = {
            "strategy": option.strategy,
            "num_devices": option.devices,
            "gradient_accumulation": option.gradient_accumulation,
            "devices": [str(state.devices[i]) for i in run.devices],
            "device_ids": list(run.devices),
            "planned_start": round(waiting.planned_start, 3),
            "planned_end": round(waiting.planned_end, 3),
            "planned_runtime": round(option.runtime, 3),
            "actual_start": round(run.started, 3),
            "actual_end": round(now, 3),
            "actual_runtime": round(now - run.started, 3),
            "sweep_started_at": state.started_at,
            "log": str(run.log),
            **self._node(state, state.devices[run.devices[0]]),
            "priced_by": "measured" if priced is None or priced.measured else priced.basis,
            "asked_at": round(waiting.asked_at, 3),
            "describe_seconds": round(waiting.describe_seconds, 3),
        }
        pool = state.pool_to_record()
        if pool is not None:
            attrs["pool"] = pool
        if profiling:
            attrs["profiling"] = profiling
        if len(waiting.prices) > 1:  # its price changed while it waited (the first and latest prices kept)
            attrs["prices"] = kept_prices(waiting.prices)
        started_at = state.started_at
        if session.objective_started_at is not None:
            attrs["objective_start"] = round(session.objective_started_at - started_at, 3)
        if session.first_step_at is not None:
            attrs["first_step"] = round(session.first_step_at - started_at, 3)
        if session.last_progress_at is not None:
            attrs["last_step"] = round(session.last_progress_at - started_at, 3)
        if session.step_seconds is not None:
            attrs["step_seconds"] = round(session.step_seconds, 5)
        if session.total_steps:
            attrs["steps"] = [session.step, session.total_steps]
        if session.resumed_from:
            attrs["resumed_from_step"] = session.resumed_from
        return attrs

    @staticmethod
    def _node(state: SweepState, device: Device) -> dict[str, Any]:
        """``saturn:node``: the Ray node a trial ran on (its name, Ray id and IP); absent on the local runner."""
        node = state.nodes.get(device.node)
        return {"node": node} if node else {}

    @staticmethod
    def _learned(run: TrialRun, state: SweepState, trial_state: TrialState) -> Learn | None:
        """What the run teaches the pricing: its real steps are its option's profile (or correct it). None when
        it failed, resumed (a part of the trial stands for no whole run), or took too few steps."""
        session = run.session
        if session.step_seconds is None or trial_state == TrialState.FAIL or session.resumed_from:
            return None
        if session.step < min(session.total_steps or 0, EARLY_LESSON_STEPS):
            return None
        tail = (
            (session.outcome_at - session.last_progress_at) if session.outcome_at and session.last_progress_at else None
        )
        return Learn(run.number, run.assignment.option, Outcomes._lesson(run, state, tail=tail))

    @staticmethod
    def _lesson(run: TrialRun, state: SweepState, *, tail: float | None) -> dict[str, Any]:
        """The run's steps so far as a profile of its option: their rate, and the start-up before them."""
        session = run.session
        # (its callers learn only from runs with a step rate, which come after their first step)
        assert session.first_step_at is not None and session.step_seconds is not None
        startup = session.first_step_at - state.started_at - run.started - session.step_seconds
        return {
            "step_seconds": session.step_seconds,
            "steps": session.step,
            "startup_seconds": max(0.0, startup),
            "tail_seconds": tail,
            "loop_steps": session.loop_steps,
        }


#: How many of a trial's prices its ``saturn:prices`` keeps: the first, and the latest ones (a trial that waits
#: behind a thousand others is re-priced after each end that teaches the pricer something).
KEPT_PRICES = 8


def kept_prices(prices: list[list]) -> list[list]:
    """The first of ``prices`` and the latest ones, :data:`KEPT_PRICES` in all."""
    return prices if len(prices) <= KEPT_PRICES else [prices[0], *prices[-(KEPT_PRICES - 1) :]]
