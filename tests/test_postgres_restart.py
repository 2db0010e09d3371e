"""The study's PostgreSQL server restarts in the middle of a sweep: the sweep waits for it (every storage call is
retried with back-off), and when it is back every trial ends as it would have, with nothing lost."""

from __future__ import annotations

import threading
import time

import objectives
import optuna
import pytest
from optuna.trial import TrialState
from postgres import postgres_server

from optuna_saturn import SaturnExecutor


@pytest.mark.launch
@pytest.mark.chaos
def test_a_sweep_outlives_a_restart_of_its_postgres_server(saturn_options, monkeypatch, caplog):
    monkeypatch.setenv("SATURN_TEST_SLEEPY_STEPS", "30")  # 3 s trials, reporting every second
    with postgres_server() as server:
        url = server.create_database("restarted")
        study = optuna.create_study(study_name="restarted", storage=url)
        downtime = []

        def restart() -> None:
            while not [
                t for t in optuna.load_study(study_name="restarted", storage=url).trials if t.intermediate_values
            ]:
                time.sleep(0.2)
            server.stop()  # while trials run and report
            stopped = time.monotonic()
            time.sleep(4.0)
            server.start()
            downtime.append(time.monotonic() - stopped)

        restarter = threading.Thread(target=restart)
        restarter.start()
        SaturnExecutor(devices=2, strategies=["single"], **saturn_options).optimize(
            study, objectives.sleepy, n_trials=4
        )
        restarter.join(timeout=60)
        trials = optuna.load_study(study_name="restarted", storage=url).trials
    assert downtime and downtime[0] >= 4.0
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    for trial in trials:
        assert sorted(trial.intermediate_values) == list(range(9, 30, 10))  # every report got through
        assert trial.system_attrs["saturn:actual_runtime"] > 0
    assert "trying again" in caplog.text
