"""What the README promises about failures and Optuna's own features, each run for real: a live sweep's heartbeat
every 5 s, a segfaulting rank (run again once, then not again past ``max_retries``), multi-objective studies, and
a callback that raises."""

from __future__ import annotations

import threading
import time

import objectives
import optuna
import pytest
from optuna.trial import TrialState

from optuna_saturn import SaturnExecutor

pytestmark = pytest.mark.launch


def test_a_live_sweep_writes_its_heartbeat_every_5_s(saturn_options, tmp_path, monkeypatch):
    storage = f"sqlite:///{tmp_path / 'study.sqlite3'}"
    study = optuna.create_study(study_name="beats", storage=storage)
    monkeypatch.setenv("SATURN_TEST_SLEEPY_STEPS", "130")  # 13 s
    seen: dict[int, float] = {}  # heartbeat's count -> its writer's time ("at")
    listed: set[int] = set()  # the trials the beats listed
    done = threading.Event()

    def watch() -> None:
        watcher = optuna.load_study(study_name="beats", storage=storage)
        while not done.wait(0.5):
            try:
                beats = [v for k, v in watcher.user_attrs.items() if k.startswith("saturn:heartbeat:")]
            except Exception:  # (a locked file, read again at the next poll: a lost watcher would fail below)
                continue
            for beat in beats:
                if beat is not None:
                    seen.setdefault(beat["beat"], beat["at"])
                    listed.update(beat["trials"])

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    SaturnExecutor(devices=1, strategies=["single"], **saturn_options).optimize(study, objectives.sleepy, n_trials=1)
    done.set()
    thread.join()
    assert study.trials[0].state == TrialState.COMPLETE
    counts = sorted(seen)
    assert len(counts) >= 2 and counts[-1] >= 3, seen  # a 13 s trial: a beat at the start, then every 5 s
    assert listed == {0}  # each beat lists the trials its sweep runs
    ended = [v for k, v in study.user_attrs.items() if k.startswith("saturn:heartbeat:")]
    assert ended == [None]  # the sweep ended: its beat is null
    # the writer's own times (the watcher's polls may miss a beat): 5 s apart, give or take a loaded machine
    per_beat = (seen[counts[-1]] - seen[counts[0]]) / (counts[-1] - counts[0])
    assert 4.5 <= per_beat <= 7.5, seen


def test_a_segfaulting_rank_fails_its_trial_which_runs_again_once(saturn_options, monkeypatch):
    study = optuna.create_study()
    SaturnExecutor(devices=1, strategies=["single"], **saturn_options).optimize(study, objectives.segfaults, n_trials=1)
    first, retry = study.trials
    assert first.state == TrialState.FAIL and "died" in first.system_attrs["saturn:fail_reason"]
    assert retry.user_attrs["saturn:retry_of"] == 0 and retry.state == TrialState.COMPLETE
    assert retry.params == first.params

    monkeypatch.setenv("SATURN_TEST_SEGFAULT_ALWAYS", "1")
    again = optuna.create_study()
    SaturnExecutor(devices=1, strategies=["single"], max_retries=1, **saturn_options).optimize(
        again, objectives.segfaults, n_trials=1
    )
    assert [t.state for t in again.trials] == [TrialState.FAIL, TrialState.FAIL]  # run again once, not twice
    assert "max_retries" not in again.trials[0].system_attrs.get("saturn:fail_reason", "")
    assert again.trials[1].system_attrs["saturn:retries"] == 1


def test_a_multi_objective_study_gets_every_value(saturn_options):
    study = optuna.create_study(directions=["minimize", "maximize"])
    SaturnExecutor(devices=2, strategies=["single"], **saturn_options).optimize(
        study, objectives.two_values, n_trials=4
    )
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 4
    for trial in study.trials:
        x = trial.params["x"]
        assert trial.values == pytest.approx([x**2, 1.0 - x])
    assert study.best_trials


def test_a_callback_that_raises_ends_the_sweep_as_in_optuna_and_leaves_nothing_running(saturn_options):
    called_for = []

    def fails(study, trial) -> None:
        called_for.append(trial.number)
        raise RuntimeError("a callback's own error")

    study = optuna.create_study()
    with pytest.raises(RuntimeError, match="a callback's own error"):
        SaturnExecutor(devices=2, strategies=["single"], **saturn_options).optimize(
            study, objectives.quadratic, n_trials=6, callbacks=[fails]
        )
    assert study.trials and not [t for t in study.trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    # the trial whose callback raised was told before it ran (whichever of the two first trials ended first: the
    # other one is stopped, and may end FAIL)
    assert called_for and study.trials[called_for[0]].state == TrialState.COMPLETE


def test_a_storage_down_longer_than_the_retries_stops_the_sweep_and_the_next_records_the_kept_result(
    saturn_options, tmp_path, monkeypatch
):
    """The README: telling is retried for 2 minutes (here 3 s); if the storage stays down longer, the sweep stops,
    and the next ``optimize`` on the study (in the same session, here) records the result the outbox kept, instead
    of ending the trial FAIL and running it again."""
    import sqlite3

    from optuna_saturn.study import outbox

    monkeypatch.setattr(outbox, "RETRY_SECONDS", 3.0)
    monkeypatch.setenv("SATURN_TEST_SLEEP_BEFORE_RETURN", "1.5")
    path = tmp_path / "study.sqlite3"
    storage = optuna.storages.RDBStorage(f"sqlite:///{path}", engine_kwargs={"connect_args": {"timeout": 0.2}})
    study = optuna.create_study(storage=storage, study_name="down")
    locked, release = threading.Event(), threading.Event()

    def take_the_storage_away() -> None:  # once the trial's last report is in: before its result
        watcher = optuna.load_study(study_name="down", storage=f"sqlite:///{path}")
        while not any(2 in t.intermediate_values for t in watcher.get_trials(deepcopy=False)):
            time.sleep(0.05)
        connection = sqlite3.connect(str(path), timeout=0)
        connection.execute("BEGIN EXCLUSIVE")
        locked.set()
        release.wait(timeout=60)
        connection.rollback()
        connection.close()

    holder = threading.Thread(target=take_the_storage_away, daemon=True)
    holder.start()
    executor = SaturnExecutor(devices=1, strategies=["single"], **saturn_options)
    with pytest.raises(outbox.STORAGE_ERRORS):  # (the last attempt's error: "database is locked", or Optuna's
        # wrapper of it when the lock met the commit)
        executor.optimize(study, objectives.slow_to_return, n_trials=1)
    assert locked.is_set()
    kept = list((saturn_options["log_dir"] / "outbox").rglob("*.json"))
    assert len(kept) == 1  # the result, on disk
    release.set()
    holder.join()

    executor.optimize(study, objectives.slow_to_return, n_trials=0)
    trials = optuna.load_study(study_name="down", storage=f"sqlite:///{path}").trials
    assert [(t.state, t.value) for t in trials] == [(TrialState.COMPLETE, 0.5)]  # recorded, not run again
    assert not list((saturn_options["log_dir"] / "outbox").rglob("*.json"))
