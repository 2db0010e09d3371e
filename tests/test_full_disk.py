"""A full disk under ``log_dir`` never costs a result (issue 47, N2): the outbox is a fallback, so a result the disk
cannot keep is still told to a healthy storage, and the sweep says once that the disk refuses writes."""

from __future__ import annotations

import errno
import logging
import os

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
