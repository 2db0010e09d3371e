"""A full disk under ``log_dir`` never costs a result (issue 47, N2): the outbox is a fallback, so a result the disk
cannot keep is still told to a healthy storage, and the sweep says once that the disk refuses writes."""

from __future__ import annotations

import errno
import io
import logging
import os
import sys

import objectives
import optuna
import pytest
from optuna.trial import TrialState

from optuna_saturn import SaturnExecutor
from optuna_saturn.study.outbox import Outbox, Outgoing

_SAID = "refuses the outbox's writes"


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_result_the_full_disk_cannot_keep_is_not_kept_and_its_partial_file_is_gone(tmp_path, monkeypatch, caplog):
    """The write that fails (here its fsync) leaves no partial file behind, and the refusal is said once."""
    outbox = Outbox(tmp_path / "outbox")
    monkeypatch.setattr(os, "fsync", _full_disk)
    with caplog.at_level(logging.WARNING, logger="optuna.saturn"):
        kept = [outbox.keep_if_it_can(Outgoing(1, number, "COMPLETE", [0.5], {})) for number in range(3)]
    monkeypatch.undo()
    assert kept == [None, None, None]
    assert list((tmp_path / "outbox").iterdir()) == []
    assert caplog.text.count(_SAID) == 1 and "No space left on device" in caplog.text


@pytest.mark.launch
def test_a_full_disk_under_log_dir_costs_no_result_and_the_sweep_says_so_once(
    saturn_options, tmp_path, monkeypatch, caplog
):
    """Every outbox write fails as on a full disk; the storage is healthy. The sweep used to abort at the first
    tell, leaving the ended trials RUNNING with their values nowhere (reliability review 3, r02)."""
    monkeypatch.setattr(Outbox, "keep", _full_disk)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.sqlite3'}")
    for offset in (1.0, 2.0, 3.0):
        study.enqueue_trial({"offset": offset})
    with caplog.at_level(logging.WARNING, logger="optuna.saturn"):
        SaturnExecutor(devices=1, strategies=["single"], **saturn_options).optimize(study, objectives.curve, n_trials=3)
    trials = optuna.load_study(study_name=study.study_name, storage=study._storage).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    assert [t.values for t in trials] == [[offset + 1.0] for offset in (1.0, 2.0, 3.0)]
    assert caplog.text.count(_SAID) == 1


def checkpoints_on_a_full_disk(trial) -> float:
    """``objectives.resumable``, whose trial 0 finds the disk full when it checkpoints (in its worker)."""
    from optuna_saturn.training import checkpoint

    real = checkpoint.save
    if trial.number == 0:
        checkpoint.save = _full_disk
    try:
        return objectives.resumable(trial)
    finally:
        checkpoint.save = real  # (the worker runs the next trial too)


@pytest.mark.launch
def test_a_checkpoint_the_full_disk_refuses_ends_only_its_trial_with_the_reason(saturn_options, tmp_path, monkeypatch):
    """A checkpoint write that failed was taken for an exception of the objective: optimize raised it, and no
    trial started after it. It is the sweep's write: the trial ends FAIL with the reason, and the sweep goes on."""
    monkeypatch.setenv("SATURN_TEST_EPOCHS", "2")
    monkeypatch.setenv("SATURN_TEST_CHECKPOINT_EVERY", "2")
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.sqlite3'}")
    options = {**saturn_options, "profile": False, "max_retries": 0}
    SaturnExecutor(devices=1, strategies=["single"], **options).optimize(study, checkpoints_on_a_full_disk, n_trials=3)
    refused, *others = study.trials
    assert refused.state == TrialState.FAIL
    reason = refused.system_attrs.get("saturn:fail_reason") or refused.user_attrs.get("saturn:fail_reason", "")
    assert "checkpoint could not be written" in reason and "No space left on device" in reason, reason
    assert [t.state for t in others] == [TrialState.COMPLETE] * 2


class _FullDiskStream(io.TextIOBase):
    """A log file on a full disk: every write is refused."""

    def write(self, text: str) -> int:
        _full_disk()
        return 0


def logs_on_a_full_disk(trial) -> float:
    """Trial 0's log line (in its worker) meets a full disk."""
    x = trial.suggest_float("x", 0.0, 1.0)
    if trial.number == 0:
        real, sys.stdout = sys.stdout, _FullDiskStream()
        try:
            print("a line for the trial's log")
        finally:
            sys.stdout = real  # (the worker runs the next trial too)
    return x


@pytest.mark.launch
def test_a_log_write_the_full_disk_refuses_ends_only_its_trial_with_the_reason(saturn_options, tmp_path):
    """It was taken for the objective's own exception: optimize raised it, and no trial started after it."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.sqlite3'}")
    options = {**saturn_options, "profile": False, "max_retries": 0}
    SaturnExecutor(devices=1, strategies=["single"], **options).optimize(study, logs_on_a_full_disk, n_trials=3)
    refused, *others = study.trials
    assert refused.state == TrialState.FAIL
    reason = refused.system_attrs.get("saturn:fail_reason") or refused.user_attrs.get("saturn:fail_reason", "")
    assert "No space left on device" in reason, reason
    assert [t.state for t in others] == [TrialState.COMPLETE] * 2
