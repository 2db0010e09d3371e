"""Effects that take trials in: one asked of the sampler or taken from the study's queue, or one of the queue's
described while it stays there (another sweep may yet take it); owned, priced, and admitted to wait."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import optuna

from optuna_saturn.pricing.prices import TrialPrice
from optuna_saturn.study.earlier_run import inherit_earlier_run, retries_of
from optuna_saturn.study.outbox import STORAGE_ERRORS, retrying
from optuna_saturn.study.queue import ParameterNotFixed, QueuedTrial
from optuna_saturn.study.stand_in import stand_in_trial
from optuna_saturn.sweep.decisions import Admit, KeepQueued
from optuna_saturn.sweep.effects.repricing import price
from optuna_saturn.sweep.effects.world import World
from optuna_saturn.sweep.state import Waiting

_logger = optuna.logging.get_logger("optuna.saturn")


@dataclass(frozen=True)
class Taken:
    """A trial taken in, priced: ``trial`` is None when another sweep took it from the queue first."""

    trial: optuna.Trial | QueuedTrial | None
    waiting: Waiting | None
    seconds: float  # how long asking (or taking) and describing it took


def ask(world: World, *, describe: bool) -> Taken:
    """The queue's next trial, or a new one asked of the sampler; described if ``describe``."""
    gateway, queue, state = world.gateway, world.queue, world.state
    asked_at, queued = world.now(), queue.next_unseen(set(state.waiting))
    trial = gateway.ask_new() if queued is None else queue.take(queued)
    if trial is None:
        return Taken(None, None, world.now() - asked_at)  # another sweep took it from the queue first
    state.took()
    number = trial.number
    is_retry = retrying(partial(inherit_earlier_run, gateway, trial), what=f"read trial {number}'s first run")
    read_checkpoint = partial(world.resumes.inherited, trial)
    inherited = retrying(read_checkpoint, what=f"read trial {number}'s checkpoint") if is_retry else None
    state.resume_from(number, inherited)
    try:
        priced = price(world, trial, describe=describe)
    except BaseException as exc:  # (the sweep stopped while it was described: it is no trial of the sweep's yet)
        with contextlib.suppress(*STORAGE_ERRORS):  # (the outbox keeps it: the next sweep tells it)
            world.gateway.fail(trial, f"not started: sweep stopped while it was described: {exc!r}")
        raise
    return _priced(world, trial, priced, asked_at, retries=retries_of(trial, is_retry=is_retry))


def preview(world: World) -> TrialPrice | None:
    """A trial the study never sees (:func:`~optuna_saturn.study.stand_in.stand_in_trial`), priced as the first
    asked trial would be; None where the study's sampler cannot be copied."""
    trial = stand_in_trial(world.gateway.study, world.gateway.lock)
    return price(world, trial, describe=True, stand_in=True) if trial is not None else None


def describe_queued(world: World) -> Taken | None:
    """Describe the queue's next trial from its fixed parameters, leaving it in the queue; None if there is none
    to describe (it samples, or it is a retry: it is asked instead). A trial no option fits is taken, to fail."""
    queue, state = world.queue, world.state
    queued = queue.next_unseen(set(state.waiting))
    if queued is None or not queue.may_describe(queued):
        return None
    started, known = world.now(), QueuedTrial(queued)
    state.resume_from(known.number, None)
    try:
        priced = price(world, known, describe=True)
    except ParameterNotFixed as exc:
        queue.samples(queued.number, str(exc))
        return None
    trial = known if priced.options else queue.take(known)  # (taken to fail it, as an asked one)
    if trial is None:
        return Taken(None, None, world.now() - started)
    if not priced.options:
        state.took()
    return _priced(world, trial, priced, started, retries=0)  # (a retry is asked, never described)


def _priced(
    world: World, trial: optuna.Trial | QueuedTrial, priced: TrialPrice, asked_at: float, *, retries: int
) -> Taken:
    now = world.now()
    options = [[-1, [p.option.to_json() for p in priced.options]]]
    waiting = Waiting(
        trial, priced, asked_at=asked_at, describe_seconds=now - asked_at, price_history=options, retries=retries
    )
    return Taken(trial, waiting, now - asked_at)


def admit(world: World, admit: Admit) -> None:
    world.state.admit(admit.waiting)


def keep_queued(world: World, kept: KeepQueued) -> None:
    world.state.forget(kept.number)
    _logger.info(f"Trial {kept.number} was not started before the sweep stopped asking: it stays queued.")


#: The decisions this module carries out, and how.
HANDLERS: dict[type, Callable[..., Any]] = {Admit: admit, KeepQueued: keep_queued}
