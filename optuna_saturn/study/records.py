"""Where the sweep keeps what it records of a trial: Optuna's *system* attributes, under ``saturn:`` keys.

A trial's ``user_attrs`` are the user's: what their objective sets, what ``trials_dataframe()`` shows as
``user_attrs_*`` columns, what their tests compare. The sweep's bookkeeping (where and how a trial ran, its prices,
its owner and claims, its checkpoint, why it failed) goes to its system attributes instead, as Optuna keeps its own
(``fixed_params``, ``fail_reason``). Two records are the user's to read by DESIGN's public contract, and stay user
attributes: ``saturn:retry_of`` (the trial a run again re-runs) and ``saturn:node`` (the Ray node a trial ran on).
Records a study got from an earlier version, in its user attributes, are still read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The prefix of every record's key.
ATTR = "saturn:"
#: The records kept as user attributes (DESIGN's public contract).
PUBLIC = frozenset({ATTR + "retry_of", ATTR + "node"})


def _attrs(trial: Any) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """(user attributes, records) of a ``FrozenTrial``, an ``optuna.Trial`` (as it last read itself) or a queued
    trial not taken yet (its ``records``)."""
    frozen = getattr(trial, "_cached_frozen_trial", trial)  # (an optuna.Trial's copy: no deprecation warning)
    system = getattr(trial, "records", None)
    if system is None:
        system = getattr(frozen, "system_attrs", None) or {}
    return getattr(frozen, "user_attrs", None) or {}, system


def record(trial: Any, key: str, default: Any = None) -> Any:
    """The trial's record ``saturn:<key>`` (``key`` without the prefix), or ``default``."""
    user, system = _attrs(trial)
    full = ATTR + key
    if full in system:
        return system[full]
    return user.get(full, default)


def records(trial: Any) -> dict[str, Any]:
    """Every ``saturn:`` record of the trial, by key without the prefix."""
    user, system = _attrs(trial)
    merged = {k: v for k, v in user.items() if k.startswith(ATTR)}
    merged.update((k, v) for k, v in system.items() if k.startswith(ATTR))
    return {k[len(ATTR) :]: v for k, v in merged.items()}


def split(attrs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``saturn:``-prefixed ``attrs`` as (the user attributes: the public records, the system attributes: the
    rest)."""
    user = {k: v for k, v in attrs.items() if k in PUBLIC}
    return user, {k: v for k, v in attrs.items() if k not in PUBLIC}
