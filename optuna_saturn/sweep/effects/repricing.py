"""Effects on what the trials cost: a trial priced (recorded on it), priced again, described late; what runs and
profiling jobs measured taught to the price source; an option left out for a workload."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna

from optuna_saturn.events import ProfileEvent
from optuna_saturn.pricing.prices import ProfileJob, TrialPrice
from optuna_saturn.study.queue import QueuedTrial
from optuna_saturn.sweep import reporting
from optuna_saturn.sweep.decisions import Describe, Learn, LeaveOut, Profiled, Reprice
from optuna_saturn.sweep.effects.world import World
from optuna_saturn.sweep.measuring import profile_results

_logger = optuna.logging.get_logger("optuna.saturn")


def price(
    world: World,
    trial: optuna.Trial | QueuedTrial,
    *,
    leaving: tuple | None = None,
    was: list | None = None,
    describe: bool = False,
    stand_in: bool = False,
) -> TrialPrice:
    """The trial's options that its checkpoint allows (``describe``: a new trial, described now; else priced
    again from its description, if any); recorded on the trial (``saturn:options``) unless they are what it
    ``was`` priced (a storage write per trial and event costs a large sweep's loop more than the re-pricing).
    ``stand_in``: a trial the study never sees (:mod:`optuna_saturn.study.stand_in`), recorded nowhere."""
    prices = world.prices
    described = prices is not None and (describe or prices.workload(trial.number) is not None)
    try:
        priced = prices.price(trial) if prices is not None and described else TrialPrice(None)
    finally:
        if stand_in and prices is not None:  # (the study's trial of that number is described for itself)
            prices.forget(trial.number)
    if priced.workload is None and priced.failure is None:  # cannot be described: planned from runtime estimates
        priced.options = world.view.estimator.priced(as_is=prices is not None and prices.prepares_nothing)
    priced = world.resumes.restricted(trial.number, priced, leaving=leaving)
    options = [p.option.to_json() for p in priced.options]
    if prices is not None and options != was and not stand_in:
        survival = world.view.survival  # (what it assumed, where it plans for the pruner)
        assumed = {} if survival.blind else {"pruning_assumed": survival.describe()}
        world.gateway.set_attrs(trial, {"options": options, "profiles": priced.profiles, **assumed})
    return priced


def describe(world: World, decision: Describe) -> None:
    waiting = decision.run.waiting
    waiting.price = price(world, waiting.trial, describe=True)


def reprice(world: World, reprice: Reprice) -> None:
    """Measurements came in (trial ``reprice.taught``'s run, or a profiling job): every waiting trial is priced
    again, and keeps the change in its price history (the simulator replays a sweep's prices from it)."""
    if world.prices is None:
        return
    for waiting in world.state.waiting.values():
        history = waiting.price_history
        waiting.price = price(world, waiting.trial, leaving=waiting.left, was=history[-1][1])
        options = [p.option.to_json() for p in waiting.price.options]
        if not history or history[-1][1] != options:
            history.append([reprice.taught, options])
    world.state.priced_again()


def learn(world: World, decision: Learn) -> bool:
    """Whether what the run measured changed a price."""
    if world.prices is None:
        return False
    taught = world.prices.learn_from_run(decision.number, decision.option, early=decision.early, **decision.lesson)
    if taught and decision.early:
        _logger.debug(  # (a sampled sweep's every trial may be a new workload: a line each)
            f"Trial {decision.number}'s first {decision.lesson['steps']} steps measured {decision.option.label}: "
            f"{decision.lesson['step_seconds']:.3g} s a step; the waiting trials are priced again."
        )
    return taught


def leave_out(world: World, left: LeaveOut) -> TrialPrice:
    """The option is never planned for the trial's workload again; returns the trial's price without it (from its
    checkpoint, if every device reads it)."""
    run, prices = left.run, world.prices
    option = run.assignment.option
    if prices is not None:
        mark = prices.mark_out_of_memory if left.out_of_memory else prices.mark_failed
        mark(run.number, option, left.error)
    world.resumes.from_run(run)
    return price(world, run.waiting.trial, leaving=run.waiting.left)


def profile_ended(world: World, profiled: Profiled) -> list[ProfileJob]:
    """Store what a profiling job measured (``where``: per trial, where its profiling ran); returns the jobs that
    measure what it did not reach."""
    state, run, end, where = world.state, profiled.run, profiled.end, profiled.where
    for number, places in where.items():
        if number in state.waiting:
            world.gateway.set_attrs(state.waiting[number].trial, {"profiling": places})
    results, unreported = profile_results(
        {n: list(s.profiles) for n, s in run.sessions.items()},
        end,
        run.log,
        expected=sum(len(e.strategies) for e in run.job.entries),
    )
    if world.prices is None:
        return []
    recorded = world.prices.record(run.job, results, state.started_at + run.started, unreported)
    follow_ups = world.prices.follow_ups(run.job, recorded)
    for entry, strategy, record in recorded:
        name, text = reporting.option_name(strategy.name, run.job), reporting.profiled(record, bool(follow_ups))
        log = _logger.warning if record is not None and record.failed else _logger.info
        log(f"Profiled {name} (trial {entry.trial.number}): {text}.")
        world.events.send("on_profile", ProfileEvent(entry.trial.number, name, "done", text))
    return follow_ups


#: The decisions this module carries out, and how.
HANDLERS: dict[type, Callable[..., Any]] = {
    Describe: describe,
    Learn: learn,
    LeaveOut: leave_out,
    Reprice: reprice,
    Profiled: profile_ended,
}
