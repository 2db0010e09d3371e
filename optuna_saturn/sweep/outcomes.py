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

from optuna_saturn.pools.protocol import JobEnd
from optuna_saturn.raised import caught
from optuna_saturn.sweep.decisions import AfterTrial, Learn, Reprice, StopOnError, Tell
from optuna_saturn.sweep.policy import Ending, Policy, Round, Steps
from optuna_saturn.sweep.run_attrs import ended_run_attrs
from optuna_saturn.sweep.state import SweepState, TrialRun

#: A run teaches its step rate once it took this many steps (or all of its steps, if it has fewer): a profiling run
#: times 5 after 2 of warm-up; the real run's rate also averages its first, slower steps in.
EARLY_LESSON_STEPS = 10


#: The exceptions of the objective that end only their trial (``study.optimize``'s ``catch``).
Catch = tuple[type[BaseException], ...]


def stop_on(raised: dict | None, number: int, catch: Catch) -> StopOnError | None:
    """Trial ``number`` ended FAIL on an exception its objective ``raised`` (None: it did not; a fault of the
    sweep's machinery, which the faults policy runs again, never is one): it stops the sweep, unless ``catch``
    lists it."""
    return None if raised is None or caught(raised, catch) else StopOnError(number, raised)


class Outcomes(Policy):
    """How a run's trial ends, and what it teaches. Its own memory: the trials that already taught early."""

    def __init__(self, *, catch: Catch = ()) -> None:
        self._taught_early: set[int] = set()  # trials whose runs taught their step rate while running
        self._catch = catch  # the exceptions of the objective that end only their trial (study.optimize's catch)

    def on_end(self, ending: Ending) -> Steps:
        """A trial's run ended: its trial is told, what the run teaches is learned, then the listeners and the
        callbacks hear of it (not of the trial whose exception stops the sweep)."""
        run = ending.trial_run
        if run is None:
            return
        tell = self.tell(run, ending.end, ending.state, ending.at, run_again=ending.run_again, reason=ending.reason,
                         profiling=ending.profiling)  # fmt: skip
        frozen = yield tell
        stop = self.stop_after(run, frozen.state, run_again=ending.run_again, reason=ending.reason)
        if stop is not None:
            yield stop
        ending.view.ended(run, frozen.state, tell.attrs["actual_runtime"])
        taught = tell.learn is not None and bool((yield tell.learn))
        yield AfterTrial(frozen, tell.attrs["actual_end"], call_back=ending.call_back and stop is None)
        ending.settle(taught=taught)

    def on_round(self, round: Round) -> Steps:
        """The running trials that teach early; each lesson that changed a price prices the waiting trials again."""
        taught: list[int] = []
        for learn in self.early_lessons(round.state):
            if (yield learn):
                taught.append(learn.number)
        for number in taught:
            yield Reprice(number)

    def stop_after(self, run: TrialRun, told: TrialState, *, run_again: bool, reason: str) -> StopOnError | None:
        """:func:`stop_on` for a run told ``told``: not one the sweep failed (``reason``) or runs again."""
        if told != TrialState.FAIL or run_again or reason:
            return None
        return stop_on((run.session.outcome or {}).get("raised"), run.number, self._catch)

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
        attrs = ended_run_attrs(run, state, now, profiling)
        if reason:
            attrs["fail_reason"] = reason
        learn = self._learned(run, state, trial_state)
        return Tell(run, trial_state, values, attrs, reason, run_again=run_again, learn=learn)

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
