from __future__ import annotations

import optuna
import pytest

import objectives
from optuna_saturn import SaturnExecutor


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"n_trials": -1}, ValueError, "n_trials"),
        ({"n_trials": 1, "timeout": 0}, ValueError, "timeout"),
        ({"n_trials": 1, "batch_size": 0}, ValueError, "batch_size"),
        ({"n_trials": 1, "callbacks": ["not callable"]}, TypeError, "callbacks"),
        ({"n_trials": 1, "catch": (ValueError, "oops")}, TypeError, "catch"),
    ],
)
def test_bad_arguments_are_rejected_before_anything_starts(kwargs, error, message):
    study = optuna.create_study()
    with pytest.raises(error, match=message):
        SaturnExecutor(devices=1, strategies=["single"]).optimize(study, objectives.quadratic, **kwargs)
    assert study.trials == []


def test_not_a_study():
    with pytest.raises(TypeError, match="optuna.Study"):
        SaturnExecutor(devices=1, strategies=["single"]).optimize("study", objectives.quadratic, n_trials=1)


def test_optimize_inside_a_worker_explains_the_main_guard(monkeypatch):
    monkeypatch.setenv("OPTUNA_SATURN_WORKER", "1")
    with pytest.raises(RuntimeError, match="__name__ == .__main__."):
        SaturnExecutor(devices=1, strategies=["single"]).optimize(optuna.create_study(), objectives.quadratic)


def test_zero_trials_is_a_no_op():
    study = optuna.create_study()
    SaturnExecutor(devices=1, strategies=["single"]).optimize(study, objectives.quadratic, n_trials=0)
    assert study.trials == []


def test_catch_accepts_what_study_optimize_accepts():
    study = optuna.create_study()
    executor = SaturnExecutor(devices=1, strategies=["single"])
    for catch in ((), ValueError, (ValueError, RuntimeError), [KeyError]):
        executor.optimize(study, objectives.quadratic, n_trials=0, catch=catch, callbacks=[], gc_after_trial=True)
