"""What the policies decide, for the loop to carry out. Plain data: a policy that returns one has done nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeAlias

from optuna.trial import FrozenTrial, TrialState

from optuna_saturn.planner import Assignment, Option, Plan
from optuna_saturn.pools.protocol import JobEnd
from optuna_saturn.pricing.prices import ProfileJob
from optuna_saturn.sweep.state import ProfileRun, TrialRun, Waiting


@dataclass(frozen=True)
class Start:
    """Start ``waiting`` now under ``option`` on ``devices`` (dispatch)."""

    waiting: Waiting
    option: Option
    devices: tuple[int, ...]


@dataclass(frozen=True)
class Measure:
    """Run the profiling job ``job`` on ``devices`` (profiling)."""

    job: ProfileJob
    devices: tuple[int, ...]


@dataclass(frozen=True)
class Planned:
    """The waiting trials' new places (global devices, times from ``now``), and the plan to show (planning)."""

    places: dict[int, Assignment]
    shown: Plan
    now: float
    unreachable: str = ""  # the sweep's deadline no plan meets: the sweep is refused before any trial starts
    earliest_end: float = 0.0  # when its trials (those to come too) end at the earliest (since the sweep started)


@dataclass(frozen=True)
class Refusal:
    """The sweep's deadline, checked before its first trial is asked: refused if ``why`` says why."""

    why: str
    earliest_end: float  # when its trials end at the earliest (since the sweep started)


@dataclass(frozen=True)
class Stop:
    """Stop the running trial ``run``: ``reason`` says why (faults: its ranks stopped moving)."""

    run: TrialRun
    reason: str


@dataclass(frozen=True)
class Fail:
    """End the waiting trial ``waiting`` FAIL (or, if it is still in the study's queue, leave it there);
    ``call_back``: Optuna's callbacks hear of it (not of a trial whose exception ``optimize`` raises, as in
    ``study.optimize``)."""

    waiting: Waiting
    reason: str
    call_back: bool = True


@dataclass(frozen=True)
class StopOnError:
    """Trial ``number``'s objective raised ``raised`` (:mod:`optuna_saturn.raised`), which ``catch`` does not list:
    as in ``study.optimize``, no trial starts after it (the waiting ones end FAIL; the queue's stay in the queue),
    the running ones end as they would, and ``optimize`` raises it."""

    number: int
    raised: dict


@dataclass(frozen=True)
class RequestMove:
    """Stop ``run`` at its next checkpoint, to go on under ``target`` (elastic)."""

    run: TrialRun
    target: Option
    summary: str


@dataclass(frozen=True)
class LeaveOut:
    """``run`` failed in a way its option, not its trial, may be at fault: the option is never planned for its
    workload again, and the trial waits for another (faults)."""

    run: TrialRun
    error: str
    out_of_memory: bool


@dataclass(frozen=True)
class Learn:
    """Teach the prices what trial ``number``'s run measured under ``option``: its steps are that option's profile
    (outcomes; ``early``: the first steps of a run still going)."""

    number: int
    option: Option
    lesson: dict[str, Any]
    early: bool = False


@dataclass(frozen=True)
class Tell:
    """End ``run``'s trial in the study (outcomes); ``run_again`` if a rank died or hung, not the trial's code."""

    run: TrialRun
    state: TrialState
    values: list[float] | None
    attrs: dict[str, Any]
    reason: str = ""
    run_again: bool = False
    learn: Learn | None = field(default=None)  # what the run teaches the prices


@dataclass(frozen=True)
class Admit:
    """``waiting``, asked and priced, waits to be planned (asking)."""

    waiting: Waiting


@dataclass(frozen=True)
class Describe:
    """Describe ``run``'s trial now, although it ran undescribed: it ran out of memory, and more micro-batches may
    fit (faults)."""

    run: TrialRun


@dataclass(frozen=True)
class Readmit:
    """``waiting`` waits again, to be planned anew (faults: its option was left out; elastic: it moved)."""

    waiting: Waiting
    reason: str


@dataclass(frozen=True)
class Moved:
    """``run``'s trial stopped at its checkpoint to move: it waits again, to go on from there under another option
    than the one it left; ``moves`` is its record of moves, this one last (elastic)."""

    run: TrialRun
    moves: list[dict]


@dataclass(frozen=True)
class Unplan:
    """These waiting trials lose their places: their devices were lost (planning)."""

    numbers: tuple[int, ...]


@dataclass(frozen=True)
class Release:
    """Give ``devices`` back to the cluster: no trial the sweep will run needs them (releasing)."""

    devices: frozenset[int]


@dataclass(frozen=True)
class AfterTrial:
    """What follows a trial's end in the study: the listeners hear of ``frozen`` (ended at ``at``), then Optuna's
    callbacks if ``call_back`` (outcomes: not for the trial whose exception ``optimize`` raises)."""

    frozen: FrozenTrial
    at: float
    call_back: bool = True


@dataclass(frozen=True)
class Profiled:
    """Store what the profiling job ``run`` measured (``where``: per trial, where its profiling ran); carried out,
    it returns the jobs that measure what it did not reach (profiling)."""

    run: ProfileRun
    end: JobEnd
    where: dict[int, list[dict]]


@dataclass(frozen=True)
class Reprice:
    """Measurements came in (trial ``taught``'s run; None: a profiling job): price every waiting trial again."""

    taught: int | None


@dataclass(frozen=True)
class KeepQueued:
    """Asking stopped before trial ``number`` of the study's queue started: it stays in the queue (WAITING, for
    the next optimize), and the sweep lets it go."""

    number: int


#: Every kind of decision: :class:`~optuna_saturn.sweep.effects.Effects` has exactly one handler for each.
Decision: TypeAlias = (
    Start
    | Measure
    | Planned
    | Refusal
    | Stop
    | Fail
    | StopOnError
    | RequestMove
    | LeaveOut
    | Learn
    | Tell
    | Admit
    | Describe
    | Readmit
    | Moved
    | Unplan
    | Release
    | AfterTrial
    | Profiled
    | Reprice
    | KeepQueued
)
