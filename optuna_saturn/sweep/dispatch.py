"""The dispatch policy: which waiting trials start now, where, and under which option.

Waiting trials start in plan order, each with its planned option, on free devices whose workers are ready: the
planned ones when they are free, any others otherwise (the devices of a node are alike), so that no device idles
while a trial could run. A trial that must wait for more devices than are free holds back the trials planned
after it, except those that end before it is planned to start (backfilling), so it is not starved. Then a trial
planned for later starts now under another option if that ends it no later than planned, on devices nobody needs
before (the plan's makespan is indifferent to such idle time; the trial is not). A trial whose options are being
measured waits for what the measurement shows. With ``optimize(n_jobs=k)``, no more than k trials run at once.
"""

from __future__ import annotations

from optuna_saturn.pools.protocol import JobEnd
from optuna_saturn.sweep.decisions import Start
from optuna_saturn.sweep.options import OptionsView
from optuna_saturn.sweep.state import ProfileRun, SweepState, TrialRun, Waiting


def starts(state: SweepState, ready: set[int], view: OptionsView, now: float) -> list[Start]:
    """The trials to start now (see the module's docstring), no more than make ``n_jobs`` run at once."""
    decided = _starts(state, ready, view, now)
    return decided if state.n_jobs is None else decided[: max(0, state.n_jobs - len(state.trial_runs()))]


def _starts(state: SweepState, ready: set[int], view: OptionsView, now: float) -> list[Start]:
    free = state.free() & ready
    measuring = {e.trial.number for r in state.running.values() if isinstance(r, ProfileRun) for e in r.job.entries}
    planned = [
        state.waiting[n]
        for n in state.plan_order  # (in plan order: by planned start)
        if n in state.waiting and state.waiting[n].assignment is not None and n not in measuring
    ]
    decided: list[Start] = []
    blocked_until: float | None = None
    later: list[Waiting] = []
    unfit = float("inf")  # the fewest devices no free node holds any more (free devices only get fewer here)
    for waiting in planned:
        assert waiting.assignment is not None  # (planned: filtered above)
        option = waiting.assignment.option
        preferred = set(waiting.assignment.devices)
        devices: list[int] | None
        if preferred <= free:
            devices = sorted(preferred)
        else:
            devices = state.topology.pick(free, option.devices) if option.devices < unfit else None
            if devices is None:
                unfit = min(unfit, option.devices)
        fits = devices is not None
        if devices is not None and (blocked_until is None or now + option.runtime <= blocked_until):
            decided.append(Start(waiting, option, tuple(devices)))
            free -= set(devices)
        else:
            later.append(waiting)
            if not fits and blocked_until is None:
                blocked_until = max(now, waiting.planned_start)
    if not later or not free:
        return decided
    needs = _earliest_needs(later)
    # no early start can end past the latest time a free device is needed by another trial (an upper bound: the
    # second earliest need of a device, the earliest being perhaps the trial's own)
    horizon = max(needs[d][1][0] if len(needs.get(d, ())) == 2 else float("inf") for d in free)
    widest = max(
        len([d for d in free if state.topology.node_of(d) == n]) for n in {state.topology.node_of(d) for d in free}
    )
    for waiting in later:
        if not free:
            break
        fastest, fewest = view.quickest(waiting, state)
        deadline = min(horizon, waiting.planned_end)
        if fewest > widest or now + fastest > deadline:  # (a quick no: most trials planned later cannot fit)
            continue
        early = _early_start(waiting, needs, free, state, view, now, deadline, widest)
        if early is not None:
            decided.append(early)
            free -= set(early.devices)
    return decided


def before_telling(ended: list[tuple[TrialRun | ProfileRun, JobEnd]]) -> bool:
    """Whether the trials planned next start before the ended ones are told: telling writes some twenty attributes
    to the storage (~0.1 s on SQLite, more on a remote database), and the freed devices would idle meanwhile. Only
    where every end is routine, a trial that ended with its result or pruned, every rank cleanly: such an end
    changes no option before it is told, where a profile, a failure or a move may."""
    return bool(ended) and all(
        isinstance(run, TrialRun)
        and end.clean
        and not run.stalled
        and (run.session.outcome or {}).get("op") in ("result", "pruned")
        for run, end in ended
    )


def _earliest_needs(later: list[Waiting]) -> dict[int, list[tuple[float, int]]]:
    """Per device, the two earliest planned starts of the waiting trials planned on it (with their numbers)."""
    needs: dict[int, list[tuple[float, int]]] = {}
    for waiting in later:
        assert waiting.assignment is not None  # (later: planned trials that did not start)
        for d in waiting.assignment.devices:
            needs[d] = sorted([*needs.get(d, []), (waiting.planned_start, waiting.number)])[:2]
    return needs


def _early_start(
    waiting: Waiting,
    needs: dict[int, list[tuple[float, int]]],
    free: set[int],
    state: SweepState,
    view: OptionsView,
    now: float,
    deadline: float,
    widest: int,
) -> Start | None:
    """``waiting`` now under whichever option ends it soonest on free devices, if that is no later than its
    planned end and no other waiting trial is planned on those devices before then (``deadline`` and ``widest``
    bound what can fit: a quick no)."""
    options, weighed = view.options(waiting, state), view.weighed_options(waiting, state)
    fits = [(o, w) for o, w in zip(options, weighed) if o.devices <= widest and now + w.runtime <= deadline]
    if not fits:
        return None

    def needed(d: int) -> float:  # when another waiting trial is planned to start on device d
        return next((start for start, number in needs.get(d, ()) if number != waiting.number), float("inf"))

    best = None
    for option, weighed_option in fits:
        end = now + weighed_option.runtime
        if end > waiting.planned_end or (best is not None and end >= best[0]):
            continue
        devices = state.topology.pick({d for d in free if needed(d) >= end}, option.devices)
        if devices is not None:
            best = (end, option, devices)
    if best is None:
        return None
    _, option, devices = best
    return Start(waiting, option, tuple(devices))
