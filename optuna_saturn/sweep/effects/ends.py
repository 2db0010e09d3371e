"""Effects that end trials in the study: a run's trial told, a waiting trial failed, and what follows every end
(the listeners, Optuna's callbacks, a run again, the checkpoints no longer needed)."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from optuna_saturn.study.gateway import ended_by_another
from optuna_saturn.study.ownership import run_again
from optuna_saturn.study.queue import QueuedTrial
from optuna_saturn.study.records import record
from optuna_saturn.sweep import reporting
from optuna_saturn.sweep.decisions import AfterTrial, Fail, StopOnError, Tell
from optuna_saturn.sweep.effects.world import World
from optuna_saturn.sweep.state import TrialRun
from optuna_saturn.training import checkpoint

_logger = optuna.logging.get_logger("optuna.saturn")


def tell(world: World, tell: Tell) -> FrozenTrial:
    """End the trial in the study; returns it as the study now has it (another sweep may have ended it first).
    What follows every end is :class:`AfterTrial`'s: the outcomes policy learns from the run in between, before
    any callback (one that stops the sweep would lose what the run taught)."""
    run = tell.run
    frozen = world.gateway.tell(run.session.trial, tell.state, tell.values, attrs=tell.attrs, log=run.log)
    if frozen.state in (TrialState.COMPLETE, TrialState.PRUNED) and not world.keep_checkpoints:
        _remove_checkpoints(world, run)
    if tell.run_again and frozen.state == TrialState.FAIL and not ended_by_another(frozen):
        _run_again(world, frozen)  # (one another sweep ended has been run again by it)
    reporting.log_finished(frozen, tell.attrs["actual_runtime"], tell.reason, run.log)
    return frozen


def fail(world: World, fail: Fail) -> None:
    """End a waiting trial FAIL with the reason (one still in the study's queue stays there)."""
    world.state.forget(fail.waiting.number)
    if isinstance(fail.waiting.trial, QueuedTrial):  # (fail.waiting.queued)
        _logger.warning(f"Trial {fail.waiting.number} stays in the study's queue: {fail.reason}.")
        return
    frozen = world.gateway.fail(fail.waiting.trial, fail.reason, attrs={"profiles": fail.waiting.price.profiles})
    _logger.warning(f"Trial {fail.waiting.number} failed: {fail.reason}.")
    after_trial(world, frozen, world.now(), call_back=fail.call_back)


def stop_on_error(world: World, stop: StopOnError) -> None:
    """No trial starts after an exception of the objective that ``catch`` does not list (see :class:`StopOnError`)."""
    state = world.state
    if state.raised is not None:
        return
    state.raised = stop.raised
    _logger.warning(
        f"Trial {stop.number} raised {stop.raised['text']}; as study.optimize does for an exception its catch does "
        "not list, no trial starts after it, the running ones finish, and optimize raises it."
    )
    for waiting in list(state.waiting.values()):
        fail(world, Fail(waiting, f"not started: trial {stop.number} raised {stop.raised['text']} first"))


def after_trial(world: World, frozen: FrozenTrial, now: float, *, call_back: bool = True) -> None:
    """What follows every trial's end: the listeners, then Optuna's callbacks and ``gc_after_trial``, in this
    process, as ``study.optimize`` does (not for trials the sweep's own interruption ended)."""
    world.events.send("on_trial_end", frozen, now)
    if call_back:
        world.gateway.call_back(world.callbacks, frozen)
    world.queue.look_again()  # its params run again, or a callback enqueued trials: ahead of new trials
    if world.gc_after_trial:
        gc.collect()


def carry_on(world: World, after: AfterTrial) -> None:
    after_trial(world, after.frozen, after.at, call_back=after.call_back)


def _run_again(world: World, frozen: FrozenTrial) -> None:
    """A trial whose rank died or hung: its params run again next, resuming from its checkpoint if it saved
    one. ``n_trials`` still counts new trials."""
    run_again(world.gateway, frozen)
    world.state.runs_again()
    _logger.warning(
        f"Trial {frozen.number}'s params run again as a new trial"
        + (" from its checkpoint." if record(frozen, "checkpoint") is not None else ".")
    )


def _remove_checkpoints(world: World, run: TrialRun) -> None:
    """A trial that ended needs no checkpoint: neither its own nor the one it resumed from."""
    checkpoint.remove(world.requests.checkpoint_folder(run.number))
    resume = world.state.resumes.get(run.number)
    if resume is not None:
        checkpoint.remove(Path(resume.path).parent)


#: The decisions this module carries out, and how.
HANDLERS: dict[type, Callable[..., Any]] = {Tell: tell, Fail: fail, StopOnError: stop_on_error, AfterTrial: carry_on}
