"""What the sweep says: its log lines, and the summary it leaves on the study (``saturn:last_sweep``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from optuna_saturn.devices import Device
from optuna_saturn.events import Broadcast, TrialProgress
from optuna_saturn.planner import Goal, Option
from optuna_saturn.planner._types import option_label
from optuna_saturn.pricing.prices import PricedOption, ProfileJob
from optuna_saturn.study.records import record
from optuna_saturn.sweep.state import SweepState, TrialRun

_LOG_TAIL_LINES = 20


def relay_progress(events: Broadcast, run: TrialRun) -> None:
    """Tell the listeners how far a running trial is, when it moved since they were last told."""
    session = run.session
    if session.step != run.reported_step:
        run.reported_step = session.step
        progress = TrialProgress(run.number, session.step, session.total_steps, session.step_seconds)
        events.send("on_trial_progress", progress)


def started(number: int, option: Option, devices: Sequence[Device], priced: PricedOption | None, log: Path) -> str:
    measured = (
        ""
        if priced is None or priced.measured
        else f" ({option_label(option.strategy, option.devices, option.gradient_accumulation)} was never measured "
        "for this model: the trial's first steps are its profile)"
    )
    accumulation = option.gradient_accumulation
    micro = f", {accumulation} micro-batches per step" if accumulation > 1 else ""
    return f"Trial {number} started: {option.strategy} on {', '.join(map(str, devices))}{micro}{measured} (log: {log})"


def option_name(strategy: str, job: ProfileJob) -> str:
    return option_label(strategy, job.devices, job.gradient_accumulation)


def devices_lost(lost: set[int], state: SweepState) -> str:
    return (
        f"Devices {', '.join(str(state.devices[d]) for d in sorted(lost))} are gone (their node died, or their "
        "worker could not start: the log above says which); "
        f"the sweep goes on with the {len(state.devices) - len(state.gone)} others."
    )


def profiled(record: Any, followed_up: bool) -> str:
    """What a profiling job measured of one option, in words."""
    if record is None:
        return "not reached, measured in another job" if followed_up else "not measured, so it is predicted"
    if record.failed:
        return f"cannot run this trial, so it is not planned for it: {record.error}"
    if not record.feasible:
        return f"does not fit ({record.error})"
    loops = f", {len(record.loop_steps)} loops" if len(record.loop_steps) > 1 else ""
    return (
        f"{record.step_seconds * 1e3:.1f} ms/step, set-up {record.startup_seconds:.1f} s, "
        f"after the loop {record.tail_seconds or 0.0:.1f} s{loops}, "
        f"peak {record.peak_memory_bytes / 2**20:.0f} MiB"
        + (" (near the device's capacity: it may run out of memory later)" if record.near_capacity else "")
    )


def log_finished(frozen: FrozenTrial, seconds: float, reason: str, log: Path) -> None:
    logger = optuna.logging.get_logger("optuna.saturn")
    if frozen.state == TrialState.COMPLETE:
        logger.info(f"Trial {frozen.number} finished in {seconds:.1f} s with value(s) {frozen.values}.")
    elif frozen.state == TrialState.PRUNED:
        logger.info(f"Trial {frozen.number} pruned after {seconds:.1f} s.")
    else:
        reason = reason or record(frozen, "fail_reason", "")  # (the study refused its value)
        logger.warning(f"Trial {frozen.number} failed after {seconds:.1f} s: {reason}\n{_tail(log)}")


def summary(
    state: SweepState, wall: float, asking: Any, planning_seconds: float, planning: Any, profiling: Any
) -> dict[str, Any]:
    """``saturn:last_sweep``: what the sweep spent its time on (the simulator replays a sweep from it)."""
    return {
        "started_at": state.started_at,
        "wall_seconds": round(wall, 3),
        "trials": state.asked,
        "profiling_runs": profiling.runs,
        "profiling_device_seconds": round(profiling.device_seconds, 3),
        "idle_device_seconds": {str(state.devices[d]): round(s, 3) for d, s in state.idle_seconds.items()},
        "planning_seconds": round(planning_seconds, 3),
        "plans": planning.version,
        "describing_seconds": round(sum(asking.ask_seconds), 3),
        "ask_seconds": _spread(asking.ask_seconds),  # (a summary: one number per trial grows without bound)
        "workers_ready": {str(state.devices[d]): round(t, 3) for d, t in sorted(state.ready_at.items())},
        "device_seconds": round(state.spent, 3),  # what its jobs held devices for (trials and profiling)
        "held_device_seconds": round(state.held_seconds(wall), 3),  # what the pool held them for (a cluster's bill)
        "released": {str(state.devices[d]): round(t, 3) for d, t in sorted(state.released.items())},
    }


def goal_report(goal: Goal, state: SweepState) -> dict[str, Any]:
    """The summary's part on what the sweep planned for (none for the earliest end) and its cost (at a price); its
    key stays "objective", which users' code reads."""
    out: dict[str, Any] = {}
    if not goal.earliest_end:
        out["objective"] = goal.summary()
    if goal.price_per_device_hour:
        out["cost"] = round(state.spent / 3600 * goal.price_per_device_hour, 2)
    return out


def _spread(seconds: Sequence[float]) -> dict[str, float | int]:
    ordered = sorted(seconds)
    if not ordered:
        return {"count": 0}
    return {"count": len(ordered), "median": round(ordered[len(ordered) // 2], 3), "max": round(ordered[-1], 3)}


def _tail(path: Path) -> str:
    """The log's last lines, read from its end (a failed trial's log may run to gigabytes)."""
    try:
        with path.open("rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0, size - _LOG_TAIL_BYTES))
            lines = log.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    " + line for line in lines[-_LOG_TAIL_LINES:])


#: How much of a failed trial's log its tail is looked for in.
_LOG_TAIL_BYTES = 64 * 1024
