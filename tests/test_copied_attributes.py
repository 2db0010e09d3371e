"""A trial's ``saturn:`` user attributes copied into another study or trial (``enqueue_trial(t.params,
user_attrs=t.user_attrs)``, a common way to run a study's best trials again) are foreign there: they never stop
the sweep, and a copied ``saturn:retry_of`` makes no run again of a trial it does not repeat (issue 47, N3)."""

from __future__ import annotations

import logging

import objectives
import optuna
import pytest
from optuna.trial import TrialState

from optuna_saturn import SaturnExecutor
from optuna_saturn.study.earlier_run import inherit_earlier_run, retries_of
from optuna_saturn.study.gateway import StudyGateway

_X = {"x": optuna.distributions.FloatDistribution(0, 1)}
COPIED = {"saturn:retry_of": 40, "saturn:retries": 1}  # trial 41 of another study, a run again of its trial 40


def _study_with_a_failed_and_a_complete_trial(tmp_path) -> optuna.Study:
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.sqlite3'}")
    distributions = {"x": optuna.distributions.FloatDistribution(0, 1)}
    failed = study.ask(distributions)  # trial 0: FAIL, with a curve
    failed.report(0.5, 1)
    study.tell(failed, state=TrialState.FAIL)
    done = study.ask(distributions)  # trial 1: COMPLETE
    study.tell(done, 0.0)
    return study


@pytest.mark.parametrize(
    ("params", "attrs", "why"),
    [
        ({"x": 0.3}, COPIED, "names 40, which is no trial of this study"),
        ({"x": 0.3}, {"saturn:retry_of": 3}, "names 3, which is no earlier trial of this study"),
        ({"x": 0.3}, {"saturn:retry_of": 1}, "names 1, which ended COMPLETE, not FAIL"),
        ({"x": 0.3}, {"saturn:retry_of": "0"}, "names '0', which is not a trial number"),
        ({"x": 0.7}, {"saturn:retry_of": 0, "saturn:retries": 1}, "names 0, which ran other params"),
    ],
)
def test_a_foreign_retry_of_is_warned_of_and_the_trial_runs_as_a_new_one(tmp_path, caplog, params, attrs, why):
    study = _study_with_a_failed_and_a_complete_trial(tmp_path)
    assert study.trials[0].params != params
    study.enqueue_trial(params, user_attrs=attrs)
    study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL, params=params, distributions=_X))  # trial 3
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    with caplog.at_level(logging.WARNING, logger="optuna.saturn"):
        assert inherit_earlier_run(StudyGateway(study), trial) is False
    assert f"Trial 2's saturn:retry_of {why}" in caplog.text and "runs as a new trial, from the start" in caplog.text
    assert retries_of(trial, is_retry=False) == 0  # a copied saturn:retries counts another study's runs
    assert trial.number == 2 and study.trials[2].intermediate_values == {}


def test_this_studys_own_run_again_inherits_its_first_runs_curve(tmp_path, caplog):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.sqlite3'}")
    failed = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    failed.report(0.5, 1)
    study.tell(failed, state=TrialState.FAIL)
    study.enqueue_trial(study.trials[0].params, user_attrs={"saturn:retry_of": 0, "saturn:retries": 1})
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    with caplog.at_level(logging.WARNING, logger="optuna.saturn"):
        assert inherit_earlier_run(StudyGateway(study), trial) is True
    assert "saturn:retry_of" not in caplog.text
    assert retries_of(trial, is_retry=True) == 1
    assert study.trials[1].intermediate_values == {1: 0.5}


@pytest.mark.launch
def test_a_copied_retry_of_queued_during_a_sweep_runs_as_a_new_trial_and_stops_nothing(saturn_options, tmp_path):
    """The r05 repro: the copied trial is queued while trials run. It raised KeyError at intake, which stopped the
    sweep, ended the running trial FAIL ("sweep stopped") and left the copied one RUNNING."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.sqlite3'}")
    copied = {"x": 2.0, "y": -1, "kind": "a"}

    def enqueue_once(study: optuna.Study, frozen) -> None:
        if frozen.number == 0:
            study.enqueue_trial(copied, user_attrs=COPIED)

    executor = SaturnExecutor(devices=2, strategies=["single"], profile=False, **saturn_options)
    executor.optimize(study, objectives.quadratic, n_trials=4, callbacks=[enqueue_once])

    trials = optuna.load_study(study_name=study.study_name, storage=f"sqlite:///{tmp_path / 's.sqlite3'}").trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4, [(t.number, t.state, t.system_attrs) for t in trials]
    again = [t for t in trials if t.user_attrs.get("saturn:retry_of") == 40]
    assert len(again) == 1 and again[0].params == copied and again[0].value == 0.0
