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


def trial_snapshot(trial: optuna.Trial) -> dict[str, Any]:
    """The trial's readable members, and its study's name, directions and attributes, as plain JSON values."""
    frozen = trial.study._storage.get_trial(trial._trial_id)
    study = trial.study
    snapshot = {
        "params": frozen.params,
        "distributions": {name: distribution_to_json(d) for name, d in frozen.distributions.items()},
        "user_attrs": frozen.user_attrs,
        "datetime_start": None if frozen.datetime_start is None else frozen.datetime_start.isoformat(),
        "relative_params": trial.relative_params,
        "constraints": trial.constraints,
        "study": {
            "study_name": study.study_name,
            "directions": [d.name for d in study.directions],
            "user_attrs": study.user_attrs,
        },
    }
    return json.loads(json.dumps(snapshot, default=_plain))


def _plain(value: Any) -> Any:
    """numpy scalars (a sampler's relative parameters) as Python numbers."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
