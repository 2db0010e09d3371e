"""Effects that place work: a plan's places written on the waiting trials, a trial started on its devices, a
profiling job started."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import optuna

from optuna_saturn.events import ProfileEvent, TrialStart
from optuna_saturn.planner import DeadlineUnreachable
from optuna_saturn.study.queue import QueuedTrial
from optuna_saturn.sweep import reporting
from optuna_saturn.sweep.decisions import Measure, Planned, Refusal, Start
from optuna_saturn.sweep.effects.world import World
from optuna_saturn.sweep.state import ProfileRun, TrialRun

_logger = optuna.logging.get_logger("optuna.saturn")


def planned(world: World, planned: Planned | None) -> None:
    state = world.state
    if planned is None:
        state.planned(None)
        return
    if planned.unreachable:
        raise DeadlineUnreachable(planned.unreachable, planned.earliest_end)
    for number, place in planned.places.items():
        waiting = state.waiting[number]
        waiting.assignment = place
        waiting.planned_start, waiting.planned_end = planned.now + place.start, planned.now + place.end
    state.planned(sorted(planned.places, key=lambda n: (planned.places[n].start, n)))
    world.events.send("on_plan", planned.shown, list(planned.places), planned.now)


def refused(world: World, refusal: Refusal) -> None:
    if refusal.why:  # (the study holds no trial of this sweep yet)
        raise DeadlineUnreachable(refusal.why, refusal.earliest_end)


def start(world: World, start: Start) -> None:
    """Start the trial; one still in the study's queue is taken from it first (unless another sweep took it)."""
    state, now = world.state, world.now()
    waiting, option, number, devices = start.waiting, start.option, start.waiting.number, start.devices
    if isinstance(waiting.trial, QueuedTrial):  # (waiting.queued)
        trial = world.queue.take(waiting.trial)
        if trial is None:
            state.forget(number)
            _logger.info(f"Trial {number} was taken from the study's queue by another sweep; it runs there.")
            return
        state.took()
        waiting.trial = trial
    assert waiting.assignment is not None  # (dispatch starts planned trials)
    waiting.assignment = replace(
        waiting.assignment,
        option=option,
        devices=devices,
        start=0.0,
        end=option.runtime,
        node=state.topology.node_of(devices[0]),
    )
    waiting.planned_start = min(waiting.planned_start, now)  # no later than planned, as long as it takes
    waiting.planned_end = waiting.planned_start + option.runtime
    request = world.requests.trial(waiting.trial, option, devices, state.resumes.get(number))
    run = TrialRun(request.key, devices, now, request.log, waiting=waiting, session=request.tasks[0].session)
    state.launched(run)
    world.pool.submit(request)
    names = [state.devices[i] for i in devices]
    _logger.info(reporting.started(number, option, names, waiting.price.option(option.choice), run.log))
    planned = (waiting.planned_start, waiting.planned_end)
    world.events.send("on_trial_start", TrialStart(number, option.strategy, tuple(map(str, names)), *planned, now))


def measure(world: World, measure: Measure) -> None:
    request = world.requests.profiling(measure.job, measure.devices)
    sessions = {t.session.trial.number: t.session for t in request.tasks}
    world.state.launched(
        ProfileRun(request.key, measure.devices, world.now(), request.log, job=measure.job, sessions=sessions)
    )
    world.pool.submit(request)
    for entry in measure.job.entries:
        for s in entry.strategies:
            name = reporting.option_name(s.name, measure.job)
            world.events.send("on_profile", ProfileEvent(entry.trial.number, name, "started"))


#: The decisions this module carries out, and how.
HANDLERS: dict[type, Callable[..., Any]] = {Planned: planned, Refusal: refused, Start: start, Measure: measure}
