"""The dispatch policy: which waiting trials start now, where, and under which option.

Waiting trials start in plan order, each with its planned option, on free devices whose workers are ready: the
planned ones when they are free, any others otherwise (the devices of a node are alike), so that no device idles
while a trial could run. A trial that must wait for more devices than are free holds back the trials planned
after it, except those that end before it is planned to start (backfilling), so it is not starved. Then a trial
planned for later starts now under another option if that ends it no later than planned, on devices nobody needs
before (the plan's makespan is indifferent to such idle time; the trial is not). A trial whose options are being
measured waits for what the measurement shows.
"""

from __future__ import annotations

from optuna_saturn.sweep.decisions import Start
from optuna_saturn.sweep.options import OptionsView
from optuna_saturn.sweep.state import ProfileRun, SweepState, Waiting


def starts(state: SweepState, ready: set[int], view: OptionsView, now: float) -> list[Start]:
    """The trials to start now (see the module's docstring)."""
    free = state.free() & ready
    measuring = {e.trial.number for r in state.running.values() if isinstance(r, ProfileRun)
                 for e in r.job.entries}
    planned = sorted(
        (w for w in state.waiting.values() if w.assignment is not None and w.number not in measuring),
        key=lambda w: (w.assignment.start, w.number),
    )
    decided: list[Start] = []
    blocked_until: float | None = None
    later: list[Waiting] = []
    for waiting in planned:
        option = waiting.assignment.option
        preferred = set(waiting.assignment.devices)
        devices = sorted(preferred) if preferred <= free else state.topology.pick(free, option.devices)
        fits = devices is not None
        if fits and (blocked_until is None or now + option.runtime <= blocked_until):
            decided.append(Start(waiting, option, tuple(devices)))
            free -= set(devices)
        else:
            later.append(waiting)
            if not fits and blocked_until is None:
                blocked_until = max(now, waiting.planned_start)
    for waiting in later:
        early = _early_start(waiting, later, free, state, view, now)
        if early is not None:
            decided.append(early)
            free -= set(early.devices)
    return decided


def _early_start(
    waiting: Waiting, later: list[Waiting], free: set[int], state: SweepState, view: OptionsView, now: float
) -> Start | None:
    """``waiting`` now under whichever option ends it soonest on free devices, if that is no later than its
    planned end and no other waiting trial is planned on those devices before then."""
    needed: dict[int, float] = {}  # device -> the earliest planned start of another waiting trial on it
    for other in later:
        if other is not waiting:
            for d in other.assignment.devices:
                needed[d] = min(needed.get(d, float("inf")), other.planned_start)
    best = None
    for option, weighed in zip(view.options(waiting, state), view.weighed_options(waiting, state)):
        end = now + weighed.runtime
        usable = {d for d in free if needed.get(d, float("inf")) >= end}
        devices = state.topology.pick(usable, option.devices)
        if devices is not None and end <= waiting.planned_end and (best is None or end < best[0]):
            best = (end, option, devices)
    if best is None:
        return None
    _, option, devices = best
    return Start(waiting, option, tuple(devices))
