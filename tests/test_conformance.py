"""A sweep leaves the study as ``study.optimize`` would: what the user's objective sets is all their namespaces
hold. The sweep's records are the trials' system attributes (``optuna_saturn.study.records``); the two public ones,
``saturn:retry_of`` and ``saturn:node``, appear only on a trial run again or run on a Ray node."""

from __future__ import annotations

import itertools

import objectives
import optuna
import pytest
from optuna.trial import TrialState

from optuna_saturn import SaturnExecutor
from optuna_saturn.pools.forked_host import why_not_fork

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
    columns = study.trials_dataframe().columns  # (system attributes are Optuna's own columns, as fixed_params)
    assert not [c for c in columns if c.startswith("user_attrs_saturn")], list(columns)


def test_an_objective_that_cannot_be_pickled_runs_in_the_pools_forks(saturn_options) -> None:
    """``study.optimize`` runs any callable; a closure that holds a lock cannot be pickled for a worker, and runs
    in the pool's processes that are forks of the executor's, where it is in memory."""
    import threading

    lock = threading.Lock()

    def objective(trial) -> float:
        with lock:
            x = trial.suggest_float("x", 0, 1)
        return x * x

    study = optuna.create_study()
    SaturnExecutor(devices=2, strategies=["single", "ddp"], **saturn_options).optimize(study, objective, n_trials=2)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2, [
        t.system_attrs.get("saturn:fail_reason") for t in study.trials
    ]


def test_an_objective_that_cannot_be_pickled_is_refused_where_no_fork_can_run_it() -> None:
    """Where the pool's processes would not be forks of this one (another machine), it is refused with the
    reason and the fix, before anything runs."""
    import threading

    from optuna_saturn.worker.objective_recipe import NotInherited, describe_objective, portable

    lock = threading.Lock()
    recipe = describe_objective(lambda trial: lock.locked(), "/tmp")
    assert recipe["kind"] == "inherited"
    with pytest.raises(NotInherited, match="cannot be pickled"):
        portable(recipe)


class _AfterTrialFails(optuna.samplers.RandomSampler):
    """A sampler whose ``after_trial`` raises on its second call."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.heard: list[int] = []

    def after_trial(self, study, trial, state, values) -> None:
        self.heard.append(trial.number)
        if len(self.heard) == 2:
            raise ZeroDivisionError("the sampler's own bug")


def test_an_exception_of_the_samplers_after_trial_reaches_the_caller(saturn_options) -> None:
    """As in ``study.optimize``: the sampler hears every trial's end once, and what it raises is raised from
    ``optimize`` (the trial's end is stored first); no trial is left RUNNING."""
    sampler = _AfterTrialFails()
    study = optuna.create_study(sampler=sampler)
    with pytest.raises(ZeroDivisionError, match="the sampler's own bug"):
        SaturnExecutor(devices=1, strategies=["single"], **saturn_options).optimize(
            study, objectives.quadratic, n_trials=4
        )
    assert TrialState.RUNNING not in [t.state for t in study.trials]
    assert len(sampler.heard) == len(set(sampler.heard)) >= 2  # (each end heard once)
    assert "after_trial" not in vars(sampler)  # (the sampler object is left as it was)


def test_an_objective_that_prepares_nothing_runs_once_per_trial_on_one_device(saturn_options, tmp_path) -> None:
    """A plain objective (no ``trial.prepare``, Trainer or Accelerator) has nothing for a strategy to choose: it
    is described once (its first trial), then every trial runs once, in a worker, as ``single`` on one device;
    never on two devices, where each rank would run it again for nothing. None of it runs in this process."""
    import os

    calls = tmp_path / "calls"

    def objective(trial) -> float:
        x = trial.suggest_float("x", -1, 1)
        with open(calls, "a") as f:
            f.write(f"{trial.number} {os.getpid()}\n")
        return x * x

    study = optuna.create_study()
    SaturnExecutor(devices=2, **saturn_options).optimize(study, objective, n_trials=5)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 5
    assert {(t.system_attrs["saturn:strategy"], t.system_attrs["saturn:num_devices"]) for t in study.trials} == {
        ("single", 1)
    }
    lines = [line.split() for line in calls.read_text().splitlines()]
    numbers = sorted(int(number) for number, _ in lines)
    # the pool host's warm-up once (a stand-in trial, number -1: what the objective imports is then imported
    # before the workers fork), trial 0 twice (described, then run), every other trial once
    assert numbers == [-1, 0, 0, 1, 2, 3, 4], numbers
    assert str(os.getpid()) not in {pid for _, pid in lines}


def test_n_jobs_caps_the_trials_running_at_once_and_show_progress_bar_draws_optunas_bar(saturn_options, capsys):
    """``n_jobs=1`` on two devices: one trial at a time (queued ones too, which the sweep describes ahead), as
    ``study.optimize(n_jobs=1)`` runs them; ``show_progress_bar=True``: Optuna's own bar, as in
    ``test_optimize_with_progbar`` of Optuna's tests."""
    study = optuna.create_study()
    for x in (0.1, 0.2):
        study.enqueue_trial({"lr": x})
    executor = SaturnExecutor(devices=2, strategies=["single", "ddp"], **saturn_options)
    executor.optimize(study, objectives.train_linear, n_trials=4, n_jobs=1, show_progress_bar=True)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 4
    runs = sorted((t.system_attrs["saturn:actual_start"], t.system_attrs["saturn:actual_end"]) for t in study.trials)
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(runs)), runs
    err = capsys.readouterr().err
    assert "Best trial: " in err and "4/4" in err
    assert why_not_fork(executor.devices) is None  # (tqdm's monitor thread, left behind the bar, is stopped)
    with pytest.warns(UserWarning, match="The timeout-based progress bar is not supported with n_jobs != 1"):
        executor.optimize(study, objectives.train_linear, timeout=1.0, n_jobs=2, show_progress_bar=True)
    assert "%|" not in capsys.readouterr().err  # (as study.optimize: no bar there)
    for wrong in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="n_jobs must be None or -1"):
            executor.optimize(study, objectives.train_linear, n_trials=1, n_jobs=wrong)
