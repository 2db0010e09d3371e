"""The policies' one interface: a scheduling rule is a :class:`Policy` whose hooks return decisions
(:mod:`~optuna_saturn.sweep.decisions`), listed once in :func:`~optuna_saturn.sweep.assemble.assemble`.

The loop calls each hook of every policy in the list's order, and has what a hook returns carried out
(:meth:`~optuna_saturn.sweep.effects.Effects.carry_out`) before it calls the next policy's. A hook returns its
decisions, or is a generator: each ``yield`` of a decision gets back what carrying it out returned (the price left
after an option is left out, the trial as the study now has it, whether a lesson changed a price), for a rule that
decides in steps. The base class's hooks decide nothing, so a rule implements only the events it cares about:

- :meth:`Policy.on_end`: a job ended (a trial's run, or a profiling job). The policies see it in turn until one
  settles it (:meth:`Ending.settle`: the trial waits again, or it was told); each reads what those before noted.
- :meth:`Policy.on_nodes_lost`: nodes died, and their devices with them.
- :meth:`Policy.on_asked`: a trial was taken in and priced.
- :meth:`Policy.on_round`: once a round, after the ends, the nodes, the plan, the starts and the asking.

Planning (when and what to plan), dispatch (what starts) and asking (when to take a trial in) also answer the loop
directly: their answers are when the loop does what, not decisions among others.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any

from optuna_saturn.pools.protocol import JobEnd
from optuna_saturn.sweep.decisions import Decision
from optuna_saturn.sweep.options import OptionsView
from optuna_saturn.sweep.state import ProfileRun, SweepState, TrialRun, Waiting

#: What a hook returns: its decisions in order, or a generator that gets back each one's result (:data:`Steps`).
Decisions = Iterable[Decision]
#: A hook that decides in steps: each ``yield`` of a decision gets back what carrying it out returned.
Steps = Generator[Decision, Any, None]


@dataclass(frozen=True)
class Round:
    """What a round's policies read: the state, the options' view, and what the loop knows besides."""

    state: SweepState
    view: OptionsView
    now: float  # seconds since the sweep started
    ready: set[int]  # devices whose workers are up
    asking_done: bool  # no trial is taken in any more
    profiling: bool  # profiling jobs wait to run (they will need devices)
    stop_requested: bool  # study.stop() was called


@dataclass
class Ending:
    """A job's end, as it passes from policy to policy: each notes what the later ones need."""

    run: TrialRun | ProfileRun
    end: JobEnd
    state: SweepState
    view: OptionsView
    now: float  # seconds since the sweep started
    at: float  # when the loop saw the job end: a trial's end as told
    reason: str = ""  # the sweep's own (it is stopping): the trial fails whatever it said, and nothing else is tried
    call_back: bool = True  # Optuna's callbacks hear of the trial (not of those the sweep's interruption ended)
    run_again: bool = False  # the trial runs again: faults note it (a rank died or hung), or the sweep's stop asks it
    profiling: list[dict] | None = None  # noted by profiling: where the trial's options were measured
    settled: bool = False  # a policy ended the matter: no later policy sees it
    taught: bool = False  # it changed a price: every waiting trial is priced again

    @property
    def trial_run(self) -> TrialRun | None:
        return self.run if isinstance(self.run, TrialRun) else None

    def settle(self, *, taught: bool) -> None:
        self.settled, self.taught = True, taught


@dataclass
class Arrival:
    """A trial taken in and priced (``seconds``: how long that took), as it passes from policy to policy."""

    waiting: Waiting
    seconds: float
    state: SweepState
    view: OptionsView
    admitted: bool = False  # noted by asking: it waits to be planned


class Policy:
    """A scheduling rule: it reads what happened and returns decisions, and does nothing itself (its memory is its
    own). Each hook below is a no-op here; see the module's docstring for when the loop calls each."""

    def on_end(self, ending: Ending) -> Decisions:
        return ()

    def on_nodes_lost(self, state: SweepState) -> Decisions:
        return ()

    def on_asked(self, arrival: Arrival) -> Decisions:
        return ()

    def on_round(self, round: Round) -> Decisions:
        return ()


def carry_out_all(decisions: Decisions, carry_out: Callable[[Decision], Any]) -> None:
    """Carry ``decisions`` out in order; a generator gets back each one's result before it decides the next."""
    if not isinstance(decisions, Generator):
        for decision in decisions:
            carry_out(decision)
        return
    try:
        decision = next(decisions)
        while True:
            decision = decisions.send(carry_out(decision))
    except StopIteration:
        return
