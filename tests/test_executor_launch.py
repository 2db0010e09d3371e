"""Real multi-process sweeps: every trial is launched through torchrun, inside a loopback-only namespace."""

from __future__ import annotations

from pathlib import Path

import objectives
import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from optuna_saturn import SaturnExecutor
from optuna_saturn.events import SweepListener

pytestmark = pytest.mark.launch


def test_ddp_trial_really_trains_and_ranks_agree(saturn_options):
    study = optuna.create_study()
    SaturnExecutor(devices=2, strategies=["ddp"], **saturn_options).optimize(study, objectives.train_linear, n_trials=1)

    trial = study.trials[0]
    assert trial.state == TrialState.COMPLETE, trial.system_attrs.get("saturn:fail_reason")
    attrs = {**trial.user_attrs, **trial.system_attrs}  # (the objective's, and the sweep's records)
    assert attrs["saturn:strategy"] == "ddp" and attrs["saturn:num_devices"] == 2
    assert attrs["world_size"] == 2 and len(set(attrs["pids"])) == 2
    losses = attrs["losses"]
    assert losses[-1] < 0.1 * losses[0], losses
    assert attrs["max_param_diff_across_ranks"] == 0.0
    assert trial.value == pytest.approx(losses[-1])
    assert sorted(trial.intermediate_values) == list(range(15))
    assert attrs["saturn:options"] and attrs["saturn:options"][0]["strategy"] == "ddp"
    for key in ("planned_start", "planned_end", "actual_start", "actual_end", "first_step", "devices", "log"):
        assert "saturn:" + key in attrs
    assert attrs["saturn:actual_end"] > attrs["saturn:first_step"] > attrs["saturn:actual_start"]


def test_worker_suggestions_come_from_the_studys_sampler(saturn_options):
    def sampler() -> optuna.samplers.BaseSampler:  # (trials may be asked before the last ended: a seeded sampler
        return optuna.samplers.RandomSampler(seed=7)  # that does not depend on finished trials compares exactly)

    plain = optuna.create_study(sampler=sampler())
    plain.optimize(objectives.quadratic, n_trials=5)
    relayed = optuna.create_study(sampler=sampler())
    executor = SaturnExecutor(devices=1, strategies=["single"], **saturn_options)
    executor.optimize(relayed, objectives.quadratic, n_trials=5, batch_size=1)

    assert [t.params for t in relayed.trials] == [t.params for t in plain.trials]
    assert [t.value for t in relayed.trials] == [t.value for t in plain.trials]


def test_median_pruner_stops_a_bad_ddp_trial_on_every_rank(saturn_options):
    study = optuna.create_study(pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1))
    for offset in (0.0, 1.0, 90.0):
        study.enqueue_trial({"offset": offset})
    executor = SaturnExecutor(devices=2, strategies=["ddp"], **saturn_options)
    executor.optimize(study, objectives.curve, n_trials=3, batch_size=1)

    states = [t.state for t in study.trials]
    assert states == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED]
    pruned = study.trials[2]
    assert max(pruned.intermediate_values) < 9  # stopped early, not after the last step
    assert "saturn:fail_reason" not in pruned.system_attrs


def test_a_failing_trial_fails_alone(saturn_options):
    """An exception ``catch`` lists ends its trial FAIL, with the reason, and the sweep goes on."""
    study = optuna.create_study()
    for fail in (1, 0, 2, 0):
        study.enqueue_trial({"fail": fail})
    executor = SaturnExecutor(devices=2, strategies=["ddp"], **saturn_options)
    executor.optimize(study, objectives.maybe_raise, n_trials=4, catch=(ValueError, RuntimeError))

    states = [t.state for t in study.trials]
    assert states == [TrialState.FAIL, TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    rank0, rank1 = study.trials[0], study.trials[2]
    assert rank0.system_attrs["saturn:fail_reason"] == "rank 0: ValueError: deliberate failure on rank 0"
    assert "deliberate failure on rank 0" in Path(rank0.system_attrs["saturn:log"]).read_text()
    assert rank1.system_attrs["saturn:fail_reason"].startswith("rank 1: RuntimeError: deliberate failure on rank 1")
    assert "deliberate failure on rank 1" in Path(rank1.system_attrs["saturn:log"]).read_text()


@pytest.mark.parametrize("profile", [True, False])
def test_an_exception_catch_does_not_list_stops_the_sweep_and_is_raised(saturn_options, profile):
    """As ``study.optimize``: the trial that raised ends FAIL, no trial starts after it, the one running finishes,
    ``optimize`` raises the objective's own exception (the same class and message), and the callbacks never hear
    of the trial that raised (described, with ``profile``, or run)."""
    study = optuna.create_study()
    for fail in (1, *[0] * 11):
        study.enqueue_trial({"fail": fail})
    executor = SaturnExecutor(devices=2, strategies=["single"], profile=profile, **saturn_options)
    heard: list[int] = []
    with pytest.raises(ValueError, match="deliberate failure on rank 0"):
        executor.optimize(
            study,
            objectives.maybe_raise,
            n_trials=12,
            catch=(KeyError,),
            callbacks=[lambda _, trial: heard.append(trial.number)],
        )
    assert 0 not in heard, heard
    states = [t.state for t in study.trials]
    assert states[0] == TrialState.FAIL and TrialState.RUNNING not in states, states
    assert "deliberate failure on rank 0" in study.trials[0].system_attrs["saturn:fail_reason"]
    failed_at = study.trials[0].datetime_complete
    assert all(t.datetime_start < failed_at for t in study.trials if t.datetime_start), states  # none after it
    assert states[-1] == TrialState.WAITING, states  # the queue's last ones never started: still queued


def test_report_in_a_multi_objective_study_raises_as_optuna_does(saturn_options):
    """Optuna's ``trial.report`` raises ``NotImplementedError`` in a multi-objective study; so does the worker's
    trial, on every rank, and ``optimize`` raises it as ``study.optimize`` would."""
    study = optuna.create_study(directions=["minimize", "minimize"])
    executor = SaturnExecutor(devices=2, strategies=["single"], **saturn_options)
    with pytest.raises(NotImplementedError, match=r"Trial\.report is not supported for multi-objective"):
        executor.optimize(study, objectives.reports, n_trials=2)
    assert TrialState.RUNNING not in [t.state for t in study.trials]


def test_study_stop_inside_the_objective_stops_asking(saturn_options):
    """``trial.study.stop()`` in the objective, as in ``study.optimize``: the trials asked finish, no more are
    asked."""
    study = optuna.create_study()
    executor = SaturnExecutor(devices=2, strategies=["single"], **saturn_options)
    executor.optimize(study, objectives.stops_the_study, n_trials=20)
    assert 2 <= len(study.trials) <= 4, len(study.trials)  # (trial 1, and those asked before its stop was heard)
    assert all(t.state == TrialState.COMPLETE for t in study.trials)


def test_failed_trial_log_is_uploaded_as_an_artifact(saturn_options, tmp_path):
    from optuna.artifacts import FileSystemArtifactStore

    store = FileSystemArtifactStore(str(tmp_path / "artifacts"))
    (tmp_path / "artifacts").mkdir()
    study = optuna.create_study()
    study.enqueue_trial({"fail": 1})
    SaturnExecutor(devices=1, strategies=["single"], artifact_store=store, **saturn_options).optimize(
        study, objectives.maybe_raise, n_trials=1, catch=ValueError
    )
    artifact_id = study.trials[0].system_attrs["saturn:log_artifact_id"]
    with store.open_reader(artifact_id) as f:
        assert b"deliberate failure on rank 0" in f.read()


@pytest.mark.parametrize("storage_kind", ["sqlite", "journal", "memory"])
def test_storages_and_continuing_a_study(saturn_options, tmp_path, storage_kind):
    storage = {
        "sqlite": f"sqlite:///{tmp_path / 'study.sqlite3'}",
        "journal": JournalStorage(JournalFileBackend(str(tmp_path / "journal.log"))),
        "memory": None,
    }[storage_kind]
    study = optuna.create_study(study_name="s", storage=storage, sampler=optuna.samplers.RandomSampler(seed=1))
    executor = SaturnExecutor(devices=2, strategies=["single"], **saturn_options)
    executor.optimize(study, objectives.quadratic, n_trials=2)
    if storage_kind != "memory":  # a fresh process would load the study like this
        study = optuna.load_study(study_name="s", storage=storage, sampler=optuna.samplers.RandomSampler(seed=2))
    executor.optimize(study, objectives.quadratic, n_trials=2)

    trials = study.trials
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert all(t.value == objectives.quadratic(optuna.trial.FixedTrial(t.params)) for t in trials)
    # (on the sweep's devices; which ones is the machine's timing: a trial this short may end before the second
    # worker is up, and the next one then runs where the first did, rather than wait: a CI rehearsal did so)
    assert {t.system_attrs["saturn:devices"][0] for t in trials} <= {"cpu:0", "cpu:1"}


class _Recorder(SweepListener):
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def on_sweep_start(self, study, devices, started_at):
        self.events.append(("sweep_start", tuple(devices)))

    def on_plan(self, study, plan, trial_numbers, now):
        self.events.append(("plan", tuple(trial_numbers), len(plan.assignments)))

    def on_trial_start(self, study, start):
        self.events.append(("start", start.number, start.strategy))

    def on_trial_progress(self, study, progress):
        self.events.append(("progress", progress.number, progress.step, progress.total))

    def on_trial_end(self, study, trial, now):
        self.events.append(("end", trial.number, trial.state))

    def on_sweep_end(self, study, now, interrupted):
        self.events.append(("sweep_end", interrupted))


class _Broken(SweepListener):
    def on_plan(self, study, plan, trial_numbers, now):
        raise RuntimeError("a buggy listener")


def test_listeners_hear_the_whole_sweep_and_a_broken_one_is_dropped(saturn_options):
    study = optuna.create_study()
    recorder = _Recorder()
    executor = SaturnExecutor(devices=1, strategies=["single"], listeners=[_Broken(), recorder], **saturn_options)
    executor.optimize(study, objectives.curve, n_trials=1)

    assert study.trials[0].state == TrialState.COMPLETE
    kinds = [e[0] for e in recorder.events]
    assert kinds[:3] == ["sweep_start", "plan", "start"] and kinds[-2:] == ["end", "sweep_end"]
    assert ("plan", (0,), 1) in recorder.events and ("end", 0, TrialState.COMPLETE) in recorder.events
    progress = [e for e in recorder.events if e[0] == "progress"]
    assert progress[0][2] == 1 and progress[-1][2:] == (10, 10)


def test_accelerate_launcher_from_a_user_strategy_folder(saturn_options, tmp_path):
    """`accelerate launch` on CPU needs ACCELERATE_USE_CPU=1 and --multi_gpu to start N synchronised processes."""
    folder = tmp_path / "strategies"
    folder.mkdir()
    (folder / "ddp-accelerate.toml").write_text(
        'name = "ddp-accelerate"\nlauncher = "accelerate"\nengine = "ddp"\nmin_devices = 2\n'
    )
    study = optuna.create_study()
    executor = SaturnExecutor(devices=2, strategies=["ddp-accelerate"], strategy_folders=[folder], **saturn_options)
    executor.optimize(study, objectives.train_linear, n_trials=1)

    attrs = {**study.trials[0].user_attrs, **study.trials[0].system_attrs}
    assert study.trials[0].state == TrialState.COMPLETE, attrs.get("saturn:fail_reason")
    assert attrs["world_size"] == 2 and len(set(attrs["pids"])) == 2
    assert attrs["max_param_diff_across_ranks"] == 0.0 and attrs["losses"][-1] < 0.1 * attrs["losses"][0]
    assert attrs["saturn:strategy"] == "ddp-accelerate"


class _Plans(SweepListener):
    def __init__(self) -> None:
        self.plans = []

    def on_plan(self, study, plan, trial_numbers, now):
        self.plans.append((tuple(trial_numbers), plan.info.get("replan")))


def test_trials_are_asked_as_devices_free_and_planned_with_observed_runtimes(saturn_options):
    """No batch barrier: a trial is asked when a device would otherwise idle, and every event re-plans the trials
    that wait, with the runtimes observed so far (not the 60 s placeholder of an objective that cannot be
    described)."""
    heard = _Plans()
    study = optuna.create_study()
    executor = SaturnExecutor(devices=2, strategies=["single"], listeners=[heard], **saturn_options)
    executor.optimize(study, objectives.quadratic, n_trials=6, batch_size=6)

    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    assert heard.plans[0][0] == (0,) and len(heard.plans) >= 6  # asked one by one, re-planned at every event
    for trial in study.trials[2:]:  # asked after the first ones ended
        assert trial.system_attrs["saturn:planned_runtime"] < 60.0


@pytest.mark.launch
def test_optuna_callbacks_hear_every_trial_and_can_stop_the_sweep(saturn_options):
    """``callbacks`` as in ``study.optimize``: each hears ``(study, frozen_trial)`` after every trial ends, in
    this process, and ``MaxTrialsCallback`` (``study.stop()``) stops asking; trials asked already finish."""
    heard: list[tuple[int, TrialState]] = []

    def record(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        assert trial.state.is_finished() and study.trials[trial.number].state == trial.state
        heard.append((trial.number, trial.state))

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    SaturnExecutor(devices=2, strategies=["single"], **saturn_options).optimize(
        study,
        objectives.quadratic,
        n_trials=20,
        batch_size=1,
        gc_after_trial=True,
        catch=(ValueError,),
        callbacks=[optuna.study.MaxTrialsCallback(3, states=(TrialState.COMPLETE,)), record],
    )
    assert 3 <= len(study.trials) < 20
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    assert sorted(heard) == sorted((t.number, t.state) for t in study.trials)
    assert not study._thread_local.in_optimize_loop  # the study is left as study.optimize leaves it


def test_a_timeout_shorter_than_describing_the_first_trial_still_runs_one_trial_per_device(saturn_options):
    """Plain Optuna's ``n_jobs`` threads start their first trials within moments of each other, so a short
    timeout still runs one trial per thread. The sweep describes each trial before it asks the next, which takes
    longer than this timeout; it still asks a trial for each device, and no more."""
    study = optuna.create_study()
    SaturnExecutor(devices=2, strategies=["single"], **saturn_options).optimize(
        study, objectives.train_linear, n_trials=20, timeout=0.001
    )
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    first, second = (t.datetime_start.timestamp() for t in study.trials)
    assert second - first > 0.001  # asked once the first was described: after the timeout


def test_past_a_timeout_a_trial_on_every_device_is_the_whole_first_round(saturn_options, monkeypatch):
    """A DDP trial planned on both devices gives each its first trial: past the timeout, no second trial is asked,
    even when the look-ahead would ask the next one at once (here it asks whenever a device's planned work ends
    within a minute; on a fresh process the first description's imports make it as eager)."""
    monkeypatch.setattr("optuna_saturn.sweep.asking.ASK_AHEAD_SECONDS", 60.0)
    study = optuna.create_study()
    SaturnExecutor(devices=2, strategies=["ddp"], **saturn_options).optimize(
        study, objectives.train_linear, n_trials=20, timeout=0.001
    )
    assert [(t.state, t.system_attrs["saturn:num_devices"]) for t in study.trials] == [(TrialState.COMPLETE, 2)]


@pytest.mark.launch
def test_optuna_integrations_mlflow_callback_logs_every_trial(saturn_options, tmp_path, monkeypatch):
    """How many teams log their sweeps: optuna-integration's MLflowCallback, through ``callbacks=``, writing to
    a local MLflow store (the file store, which MLflow 3 keeps behind an opt-in)."""
    import mlflow  # (dev dependencies: mlflow-skinny, optuna-integration)
    from optuna_integration.mlflow import MLflowCallback

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    study = optuna.create_study(study_name="logged", sampler=optuna.samplers.RandomSampler(seed=0))
    SaturnExecutor(devices=2, strategies=["single"], **saturn_options).optimize(
        study, objectives.quadratic, n_trials=3, callbacks=[MLflowCallback(tracking_uri=uri, metric_name="value")]
    )
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["logged"], output_format="list")
    logged = sorted((float(r.data.params["x"]), r.data.metrics["value"]) for r in runs)
    expected = sorted((t.params["x"], t.value) for t in study.trials)
    assert len(logged) == 3 and all(a == pytest.approx(b) for a, b in zip(logged, expected)), (logged, expected)
