"""What a worker's trial knows of the real ``optuna.Trial`` and its study without asking: a snapshot taken when
the run starts, sent with the job (JSON), so that ``trial.params``, ``trial.user_attrs``, ``trial.study.study_name``
and the like answer on any rank, alone, without a collective (a read on rank 0 only, for logging, must not wait
for the other ranks). What the run itself changes (suggestions, ``set_user_attr``, ``set_constraint``) the
worker's trial adds to its copy."""

from __future__ import annotations

import json
from typing import Any

import optuna
from optuna.distributions import distribution_to_json

# (what Optuna's own ``Trial.constraints`` reads them with, here from the trial already read: one read, not two)
from optuna.study._constrained_optimization import _get_constraints_from_system_attrs


def trial_snapshot(trial: Any, study: optuna.Study | None = None) -> dict[str, Any]:
    """The trial's readable members, and its study's name, directions and attributes, as plain JSON values.
    ``trial``: the real ``optuna.Trial``, or a queued trial not taken yet (a profiling run measures one: its fixed
    parameters and attributes, ``study`` the study it is queued in)."""
    if isinstance(trial, optuna.Trial):
        study = trial.study
        frozen = study._storage.get_trial(trial._trial_id)
        params, distributions, user_attrs = frozen.params, frozen.distributions, frozen.user_attrs
        started = frozen.datetime_start
        # (what the sampler already sampled jointly: reading trial.relative_params would make it sample now, and
        # Optuna never does for a trial whose parameters the queue fixed)
        relative = dict(getattr(trial, "_relative_params", None) or {})
        constraints = _get_constraints_from_system_attrs(frozen.system_attrs)
    else:
        params, distributions = dict(trial.params), dict(trial.distributions)
        user_attrs, started, relative, constraints = dict(trial.user_attrs), None, {}, {}
    snapshot = {
        "params": params,
        "distributions": {name: distribution_to_json(d) for name, d in distributions.items()},
        "user_attrs": user_attrs,
        "datetime_start": None if started is None else started.isoformat(),
        "relative_params": relative,
        "constraints": constraints,
        "study": {}
        if study is None
        else {
            "study_name": study.study_name,
            "directions": [d.name for d in study.directions],
            "user_attrs": study.user_attrs,
        },
    }
    plain: dict[str, Any] = json.loads(json.dumps(snapshot, default=_plain))  # (a dict in, a dict out)
    return plain


def _plain(value: Any) -> Any:
    """numpy scalars (a sampler's relative parameters) as Python numbers; anything else JSON has no word for (an
    in-memory storage keeps attributes of any type) as its text, rather than no snapshot at all."""
    if hasattr(value, "item"):
        try:
            return value.item()
        except (ValueError, TypeError):  # (an array of several values)
            pass
    return repr(value)
