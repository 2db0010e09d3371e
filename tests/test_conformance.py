"""A sweep leaves the study as ``study.optimize`` would: what the user's objective sets is all their namespaces
hold. The sweep's records are the trials' system attributes (``optuna_saturn.study.records``); the two public ones,
``saturn:retry_of`` and ``saturn:node``, appear only on a trial run again or run on a Ray node."""

from __future__ import annotations

import objectives
import optuna
import pytest
from optuna.trial import TrialState

from optuna_saturn import SaturnExecutor

pytestmark = pytest.mark.launch


def test_the_users_attributes_are_the_users_alone(saturn_options, tmp_path) -> None:
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="s")
    SaturnExecutor(devices=2, strategies=["single", "ddp"], **saturn_options).optimize(
        study, objectives.train_linear, n_trials=2
    )
    for trial in study.trials:
        assert trial.state == TrialState.COMPLETE, trial.system_attrs.get("saturn:fail_reason")
        assert not [key for key in trial.user_attrs if key.startswith("saturn:")], sorted(trial.user_attrs)
        assert trial.system_attrs["saturn:strategy"] in ("single", "ddp")  # (the sweep's records are kept)
        assert trial.user_attrs["world_size"] in (1, 2)  # (what the objective set is there)
    columns = study.trials_dataframe().columns
    assert not [c for c in columns if "saturn" in c], list(columns)
