from __future__ import annotations

import subprocess
import sys
import textwrap

import objectives
import optuna
import pytest

from optuna_saturn import SaturnExecutor


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"n_trials": -1}, ValueError, "n_trials"),
        ({"n_trials": 1, "timeout": 0}, ValueError, "timeout"),
        ({"n_trials": 0, "timeout": float("nan")}, ValueError, r"timeout must be a positive number .* got nan"),
        ({"n_trials": 0, "timeout": True}, ValueError, r"timeout must be a positive number .* got True"),
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


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"devices": 2.5}, r"devices must be .*an int .* got 2\.5\. Pass a whole number of devices: devices=2\."),
        ({"devices": float("nan")}, r"devices must be .* got nan\.$"),
        ({"plan_time_limit": -1}, r"plan_time_limit must be a finite number of seconds > 0 .* got -1\."),
        ({"plan_time_limit": 0}, r"plan_time_limit must be .* got 0\."),
        ({"plan_time_limit": float("nan")}, r"plan_time_limit must be .* got nan\."),
        ({"grace_period": -1}, r"grace_period must be a finite number of seconds >= 0 .*SIGKILL.* got -1\."),
        ({"grace_period": float("nan")}, r"grace_period must be .* got nan\."),
        ({"budget": True}, r"budget must be a positive finite number of device-hours, got True\."),
        ({"solver": "nope"}, r"solver must be one of auto, .* got 'nope'\."),
    ],
)
def test_bad_executor_arguments_are_refused_by_the_constructor_with_the_fix(kwargs, message):
    """Refused before any trial is asked (and before a NaN reads as "no limit" deep in a sweep)."""
    with pytest.raises(ValueError, match=message):
        SaturnExecutor(**{"devices": 1, "strategies": ["single"], **kwargs})


def test_a_stopped_trial_may_get_no_grace_at_all():
    SaturnExecutor(devices=1, strategies=["single"], grace_period=0)


def test_not_a_study():
    with pytest.raises(TypeError, match=r"optuna\.Study"):
        SaturnExecutor(devices=1, strategies=["single"]).optimize("study", objectives.quadratic, n_trials=1)


def test_optimize_inside_a_worker_explains_the_main_guard(monkeypatch):
    monkeypatch.setenv("OPTUNA_SATURN_WORKER", "1")
    with pytest.raises(RuntimeError, match=r"__name__ == .__main__."):
        SaturnExecutor(devices=1, strategies=["single"]).optimize(optuna.create_study(), objectives.quadratic)


@pytest.mark.launch
def test_a_script_without_the_main_guard_fails_with_the_reason_not_just_a_log(saturn_options, tmp_path):
    """The workers import the objective's script; one that starts a sweep at import ends the pool's host. The
    executor's error says why, with the fix, instead of only pointing at the host's log."""
    script = tmp_path / "no_guard.py"
    script.write_text(
        textwrap.dedent(f"""
        import optuna
        from optuna_saturn import SaturnExecutor

        def objective(trial):
            return trial.suggest_float("x", 0, 1)

        SaturnExecutor(devices=1, strategies=["single"], isolate_network=True, log_dir={str(tmp_path / "runs")!r},
                       profile_store={str(tmp_path / "profiles")!r}, progress="plain", dashboard=False,
                       ).optimize(optuna.create_study(), objective, n_trials=1)
    """)
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "the worker pool's host exited" in last and '__name__ == "__main__"' in last, done.stderr[-3000:]


def test_zero_trials_is_a_no_op():
    study = optuna.create_study()
    SaturnExecutor(devices=1, strategies=["single"]).optimize(study, objectives.quadratic, n_trials=0)
    assert study.trials == []


def test_catch_accepts_what_study_optimize_accepts_and_refuses_what_it_refuses():
    study = optuna.create_study()
    executor = SaturnExecutor(devices=1, strategies=["single"])
    for catch in ((), ValueError, (ValueError, RuntimeError), [KeyError]):
        executor.optimize(study, objectives.quadratic, n_trials=0, catch=catch, callbacks=[], gc_after_trial=True)
    assert study.trials == []
    for wrong in ("ValueError", (ValueError, 3), [object]):
        with pytest.raises(TypeError, match="catch must be exception classes"):
            executor.optimize(study, objectives.quadratic, n_trials=0, catch=wrong)


def test_an_in_memory_sqlite_storage_is_refused_before_anything_runs():
    """Each thread of a sweep (the heartbeat, the workers' requests) would see its own empty database."""
    from optuna_saturn import SaturnExecutor

    study = optuna.create_study(storage="sqlite:///:memory:")
    with pytest.raises(ValueError, match=r"in-memory SQLite database.*sqlite:///sweep\.sqlite3"):
        SaturnExecutor(devices=1, strategies=["single"], progress=None, dashboard=False).optimize(
            study, lambda trial: 0.0, n_trials=1
        )
