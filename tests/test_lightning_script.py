"""A Lightning script as users write it runs as an optuna-saturn trial under every strategy: a LightningDataModule,
ModelCheckpoint, EarlyStopping and a CSVLogger, each trial in folders of its own; and a trial whose worker is
killed goes on from its last checkpoint, as an uninterrupted run would have."""

from __future__ import annotations

from pathlib import Path

import lightning_objectives
import optuna
import pytest
import torch
from optuna.trial import TrialState
from support import kill_a_worker_once

from optuna_saturn import SaturnExecutor
from optuna_saturn.study.folders import safe

pytestmark = pytest.mark.launch

PARAMS = {"learning_rate": 3e-3}


@pytest.mark.parametrize("strategy,devices", [("single", 1), ("ddp", 2), ("fsdp", 2)])
def test_checkpoints_early_stopping_a_csv_logger_and_a_datamodule(
    saturn_options, tmp_path, monkeypatch, strategy, devices
):
    monkeypatch.setenv("SATURN_TEST_LIGHTNING_DIR", str(tmp_path / "lightning"))
    monkeypatch.setenv("SATURN_TEST_PATIENCE", "1")  # stops at its second validation, step 6, on every rank
    study = optuna.create_study()
    study.enqueue_trial(PARAMS)
    SaturnExecutor(devices=devices, strategies=[strategy], **saturn_options).optimize(
        study, lightning_objectives.lightning_real_script, n_trials=1
    )
    (trial,) = study.trials
    assert trial.state == TrialState.COMPLETE, trial.system_attrs.get("saturn:fail_reason")
    assert trial.system_attrs["saturn:strategy"] == strategy
    assert trial.user_attrs["global_step"] == 6  # of 18: EarlyStopping stopped it, on every rank at once
    run = f"{safe(study.study_name)}-trial-{trial.number}"  # (per study and trial: see the test below)
    best = Path(trial.user_attrs["best_model_path"])
    assert best.parent == tmp_path / "lightning" / "best" / run and best.is_file()
    saved = torch.load(best, map_location="cpu", weights_only=False)["state_dict"]
    whole = lightning_objectives.TinyGPT2(1e-3).state_dict()
    assert {k: tuple(v.shape) for k, v in saved.items()} == {k: tuple(v.shape) for k, v in whole.items()}
    log_dir = Path(trial.user_attrs["log_dir"])
    assert log_dir == tmp_path / "lightning" / "csv" / "gpt2" / run
    assert "val_loss" in (log_dir / "metrics.csv").read_text().splitlines()[0]
    assert sorted(p.name for p in (tmp_path / "lightning" / "csv" / "gpt2").iterdir()) == [run]


def test_studies_never_share_a_folder_and_profiling_writes_none(saturn_options, tmp_path, monkeypatch):
    """Two studies run from one folder each keep their trial 0's logs and checkpoints (folders per study and
    trial); profiling runs (two strategies: each trial is measured first) leave nothing in the script's folders."""
    monkeypatch.setenv("SATURN_TEST_LIGHTNING_DIR", str(tmp_path / "lightning"))
    for name in ("first", "second"):
        study = optuna.create_study(study_name=name, storage=f"sqlite:///{tmp_path / 'studies.db'}")
        study.enqueue_trial(PARAMS)
        SaturnExecutor(devices=2, strategies=["single", "ddp"], **saturn_options).optimize(
            study, lightning_objectives.lightning_real_script, n_trials=1
        )
        assert study.trials[0].state == TrialState.COMPLETE, study.trials[0].system_attrs.get("saturn:fail_reason")
    for kind in ("csv/gpt2", "best"):
        assert sorted(p.name for p in (tmp_path / "lightning" / kind).iterdir()) == ["first-trial-0", "second-trial-0"]
    assert all(
        (tmp_path / "lightning" / "csv" / "gpt2" / f"{name}-trial-0" / "metrics.csv").is_file()
        for name in ("first", "second")
    )
    assert not [p for p in (tmp_path / "lightning").rglob("*") if "profile" in p.name]


@pytest.mark.parametrize("strategy,devices,worker", [("single", 1, "saturn-worker-0"), ("ddp", 2, "saturn-worker-1")])
def test_a_killed_lightning_trial_goes_on_from_its_last_checkpoint(
    saturn_options, tmp_path, monkeypatch, strategy, devices, worker
):
    """Validation every 3 steps, the trial's checkpoint after each (at steps 4, 7, 10, ...); the first run hangs
    after step 11 and its worker is killed: the trial runs again from step 10 and ends with an uninterrupted
    run's validation loss."""
    monkeypatch.setenv("SATURN_TEST_LIGHTNING_DIR", str(tmp_path / "reference"))
    reference = optuna.create_study()
    reference.enqueue_trial(PARAMS)
    options = {**saturn_options, "log_dir": tmp_path / "reference-runs"}
    SaturnExecutor(devices=devices, strategies=[strategy], **options).optimize(
        reference, lightning_objectives.lightning_real_script, n_trials=1
    )
    assert reference.trials[0].state == TrialState.COMPLETE, reference.trials[0].system_attrs.get("saturn:fail_reason")

    monkeypatch.setenv("SATURN_TEST_LIGHTNING_DIR", str(tmp_path / "killed"))
    monkeypatch.setenv("SATURN_TEST_HANG_AT", "11")
    storage = f"sqlite:///{tmp_path / 'study.sqlite3'}"
    study = optuna.create_study(study_name="killed", storage=storage)
    study.enqueue_trial(PARAMS)
    killer = kill_a_worker_once(
        storage, "killed", worker, lambda t: 9 in t.intermediate_values and _checkpointed(t, 10)
    )
    SaturnExecutor(devices=devices, strategies=[strategy], **saturn_options).optimize(
        study, lightning_objectives.lightning_real_script, n_trials=1
    )
    killer.join(timeout=5)
    first, again = optuna.load_study(study_name="killed", storage=storage).trials
    assert first.state == TrialState.FAIL
    assert again.state == TrialState.COMPLETE, again.system_attrs.get("saturn:fail_reason")
    assert again.user_attrs["saturn:retry_of"] == first.number and again.system_attrs["saturn:resumed_from_step"] == 10
    # the run again goes on in the first run's folder, and its CSV history keeps every step the first run logged
    assert again.user_attrs["log_dir"] == first.user_attrs.get("log_dir", again.user_attrs["log_dir"])
    logged = (Path(again.user_attrs["log_dir"]) / "metrics.csv").read_text().splitlines()
    steps = {int(float(row.split(",")[logged[0].split(",").index("step")])) for row in logged[1:]}
    assert {2, 5, 8} <= steps and max(steps) >= 17, sorted(steps)  # before the kill, and after it
    assert again.user_attrs["global_step"] == 18
    assert again.value == pytest.approx(reference.trials[0].value, rel=1e-4)
    for step in (12, 15, 18):
        assert again.intermediate_values[step] == pytest.approx(reference.trials[0].intermediate_values[step], rel=1e-4)


def _checkpointed(trial: optuna.trial.FrozenTrial, step: int) -> bool:
    return (trial.system_attrs.get("saturn:checkpoint") or {}).get("step") == step
