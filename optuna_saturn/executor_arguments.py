"""``SaturnExecutor``'s own arguments, checked in its constructor: a wrong one is refused with the fix before any
trial is asked, since the sweep that would have used it (a plan's time limit, a stopped trial's grace) may only
read it much later, or read a NaN as "no limit"."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

from optuna_saturn.planner import SOLVERS


def is_number(value: Any) -> bool:
    """A real number, not a bool (``True`` reads as 1 to Python, never to a person passing a limit)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_seconds(value: Any, name: str, *, what: str, zero_ok: bool = False, none_ok: bool = False) -> None:
    """``ValueError`` naming ``name`` unless ``value`` is a finite number of seconds above 0 (or at 0, or None)."""
    if value is None and none_ok:
        return
    if is_number(value) and math.isfinite(value) and (value > 0 or (zero_ok and value == 0)):
        return
    bound = ">= 0" if zero_ok else "> 0"
    none = " or None" if none_ok else ""
    raise ValueError(f"{name} must be a finite number of seconds {bound}{none} ({what}), got {value!r}.")


def check_devices(devices: Any) -> None:
    """Refuses what :func:`~optuna_saturn.devices.resolve_devices` cannot read as a kind, a count or a list."""
    if isinstance(devices, (str, Iterable, numbers.Integral)):
        return  # (a bool: resolve_devices says why not)
    finite = is_number(devices) and math.isfinite(devices) and devices >= 1
    whole = f" Pass a whole number of devices: devices={math.floor(devices)}." if finite else ""
    raise ValueError(
        f"devices must be 'auto', 'cpu', 'cuda', 'cpu:N', an int (how many devices) or a list of CUDA indices, "
        f"got {devices!r}.{whole}"
    )


def check_executor_arguments(
    *,
    devices: Any,
    solver: str,
    plan_time_limit: Any,
    grace_period: Any,
    describe_timeout: Any,
    collective_timeout: Any,
    stall_timeout: Any,
    max_retries: Any,
) -> None:
    """Every argument of the constructor that is a plain value, or ``ValueError`` naming the one that is wrong."""
    check_devices(devices)
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {', '.join(SOLVERS)}, got {solver!r}.")
    check_seconds(plan_time_limit, "plan_time_limit", what="what the planner may spend per plan; default 10")
    grace = "what a stopped trial gets after SIGTERM, before SIGKILL; default 10"
    check_seconds(grace_period, "grace_period", what=grace, zero_ok=True)
    check_seconds(describe_timeout, "describe_timeout", what="what describing a trial may take")
    if not (is_number(collective_timeout) and collective_timeout > 0):  # inf: no limit
        raise ValueError(f"collective_timeout must be a positive number of seconds, got {collective_timeout!r}.")
    if stall_timeout is not None and not (is_number(stall_timeout) and stall_timeout > 0):
        raise ValueError(f"stall_timeout must be a positive number of seconds or None, got {stall_timeout!r}.")
    if not isinstance(max_retries, int) or isinstance(max_retries, bool) or max_retries < 0:
        raise ValueError(f"max_retries must be an integer >= 0 (0: never run a trial again), got {max_retries!r}.")
