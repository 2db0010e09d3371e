"""The ``saturn:`` attributes a trial's ended run leaves on it: where and how it ran (strategy, devices, node,
planned and actual times, how it was priced, and its price history), so that the schedule chart,
``optuna-saturn report`` and the simulator can replay the sweep."""

from __future__ import annotations

from typing import Any

from optuna_saturn.devices import Device
from optuna_saturn.sweep.state import SweepState, TrialRun


def ended_run_attrs(run: TrialRun, state: SweepState, now: float, profiling: list[dict] | None) -> dict[str, Any]:
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
        **_node(state, state.devices[run.devices[0]]),
        "priced_by": "measured" if priced is None or priced.measured else priced.basis,
        "asked_at": round(waiting.asked_at, 3),
        "describe_seconds": round(waiting.describe_seconds, 3),
    }
    pool = state.pool_to_record()
    if pool is not None:
        attrs["pool"] = pool
    if profiling:
        attrs["profiling"] = profiling
    if len(waiting.price_history) > 1:  # its price changed while it waited (the first and latest prices kept)
        attrs["prices"] = kept_prices(waiting.price_history)
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


def _node(state: SweepState, device: Device) -> dict[str, Any]:
    """``saturn:node``: the Ray node a trial ran on (its name, Ray id and IP); absent on the local runner."""
    node = state.nodes.get(device.node)
    return {"node": node} if node else {}


#: How many of a trial's prices its ``saturn:prices`` keeps: the first, and the latest ones (a trial that waits
#: behind a thousand others is re-priced after each end that teaches the pricer something).
KEPT_PRICES = 8


def kept_prices(prices: list[list]) -> list[list]:
    """The first of ``prices`` and the latest ones, :data:`KEPT_PRICES` in all."""
    return prices if len(prices) <= KEPT_PRICES else [prices[0], *prices[-(KEPT_PRICES - 1) :]]
