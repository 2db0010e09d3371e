"""A study's folders on disk are its own: two studies of one name (in two storages, or names that clean to one
string) never share a checkpoint or an outbox, no name escapes the folder it is put in, and a retried trial resumes
only from a checkpoint in its study's own folder that nobody else could have written."""

from __future__ import annotations

import os
from pathlib import Path

import objectives
import optuna
import pytest
from optuna.trial import TrialState

from optuna_saturn import SaturnExecutor
from optuna_saturn.devices import Device
from optuna_saturn.study.folders import FOLDER_ATTR, safe, study_folder
from optuna_saturn.sweep.resumes import Resumes
from optuna_saturn.sweep.state import SweepState
from optuna_saturn.training import checkpoint


@pytest.mark.parametrize("name", [".", "..", "...", "", "a/../..", "/etc"])
def test_no_name_cleans_to_a_folder_that_escapes(name):
    cleaned = safe(name)
    assert cleaned and cleaned.strip(".") and "/" not in cleaned


def test_two_studies_of_one_name_in_two_storages_get_two_folders(tmp_path):
    first = optuna.create_study(study_name="saturn", storage=f"sqlite:///{tmp_path / 'a.sqlite3'}")
    second = optuna.create_study(study_name="saturn", storage=f"sqlite:///{tmp_path / 'b.sqlite3'}")
    spaced = optuna.create_study(study_name="a b")
    underscored = optuna.create_study(study_name="a_b")
    folders = [study_folder(s) for s in (first, second, spaced, underscored)]
    assert len(set(folders)) == 4 and all(f.startswith(("saturn-", "a_b-")) for f in folders)
    assert study_folder(first) == folders[0]  # stored in the study: the same for every sweep on it
    again = optuna.load_study(study_name="saturn", storage=f"sqlite:///{tmp_path / 'a.sqlite3'}")
    assert again.user_attrs[FOLDER_ATTR] == folders[0]


def test_a_folder_attribute_that_is_not_a_folder_name_is_refused(tmp_path):
    study = optuna.create_study()
    study.set_user_attr(FOLDER_ATTR, "../elsewhere")
    with pytest.raises(ValueError, match="must be one folder name"):
        study_folder(study)


def _record(path: Path) -> checkpoint.CheckpointRecord:
    return checkpoint.CheckpointRecord(str(path), 4, checkpoint.DCP, "single", 1, 0.0)


def test_a_checkpoint_outside_the_studys_folders_or_writable_by_others_is_not_loaded(tmp_path):
    root = tmp_path / "runs" / "checkpoints" / "study-0123"
    resumes = Resumes(SweepState(0.0, [Device("cpu", 0)]), {}, root=root, shared=True, exists=checkpoint.exists_at)
    own = root / "trial-3" / "step-4"
    own.mkdir(parents=True)
    for folder in (tmp_path, *root.relative_to(tmp_path).parents, root, own.parent, own):
        os.chmod(tmp_path / folder, 0o755)
    assert resumes.refused(_record(own)) == ""
    # a folder named like the study's anywhere else on disk (another log_dir, or /tmp/<it>/...: anyone can make one)
    elsewhere = tmp_path / "elsewhere" / "checkpoints" / "study-0123" / "trial-1" / "step-8"
    elsewhere.mkdir(parents=True)
    assert "this study's checkpoint folder" in resumes.refused(_record(elsewhere))
    # a component missing when it is checked (it could be swapped in before the load)
    assert "does not exist" in resumes.refused(_record(root / "trial-9" / "step-4"))

    other_study = tmp_path / "runs" / "checkpoints" / "study-4567" / "trial-3" / "step-4"
    other_study.mkdir(parents=True)
    assert "this study's checkpoint folder" in resumes.refused(_record(other_study))
    assert "not a trial's checkpoint" in resumes.refused(_record(root / "trial-3" / ".." / "trial-3" / "step-4"))
    assert "not a trial's checkpoint" in resumes.refused(_record(root / "other" / "step-4"))

    os.chmod(own, 0o777)
    assert "writable by others" in resumes.refused(_record(own))
    os.chmod(own, 0o755)
    os.chmod(tmp_path / "runs", 0o777)  # anyone could swap the study's folder
    assert "may be changed by another user" in resumes.refused(_record(own))
    os.chmod(tmp_path / "runs", 0o1777)  # (sticky, as /tmp: others cannot rename what is not theirs)
    assert resumes.refused(_record(own)) == ""
    link = root / "trial-5"
    link.symlink_to(own.parent)
    assert resumes.refused(_record(link / "step-4")) != ""  # (reached through a link: not where it says)


@pytest.mark.launch
def test_two_studies_of_one_name_never_touch_each_others_checkpoints(saturn_options, tmp_path, monkeypatch):
    """The same study name in two storages, one log folder: each trial's checkpoint is in its own study's folder,
    and both are still there after both sweeps (before, the second sweep's save deleted the first's)."""
    monkeypatch.setenv("SATURN_TEST_EPOCHS", "2")
    kept = {}
    for storage in ("a", "b"):
        study = optuna.create_study(study_name="saturn", storage=f"sqlite:///{tmp_path / storage}.sqlite3")
        study.enqueue_trial({"lr": 0.02})
        SaturnExecutor(devices=1, strategies=["single"], keep_checkpoints=True, **saturn_options).optimize(
            study, objectives.resumable, n_trials=1
        )
        (trial,) = study.trials
        assert trial.state == TrialState.COMPLETE
        kept[storage] = checkpoint.CheckpointRecord.from_json(trial.system_attrs["saturn:checkpoint"])
        assert study_folder(study) in kept[storage].path
    assert kept["a"].path != kept["b"].path
    assert all(checkpoint.exists(record) for record in kept.values())


def test_a_storage_url_is_printed_without_its_password():
    from optuna_saturn.study.urls import without_password

    assert (
        without_password("postgresql+psycopg2://saturn:s3cret@127.0.0.1:5432/db")
        == "postgresql+psycopg2://saturn:***@127.0.0.1:5432/db"
    )
    assert without_password("sqlite:///sweep.sqlite3") == "sqlite:///sweep.sqlite3"
    assert without_password("not a url") == "not a url"


def test_a_node_folder_someone_else_could_read_or_a_link_is_refused(tmp_path):
    from optuna_saturn.pools.logs import private_folder

    mine = tmp_path / "sweep"
    private_folder(str(mine))
    assert oct(mine.stat().st_mode & 0o777) == oct(0o700)
    private_folder(str(mine))  # (again: it is this user's)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    with pytest.raises(PermissionError, match="no one else can read"):
        private_folder(str(shared))
    link = tmp_path / "link"
    link.symlink_to(mine)
    with pytest.raises(PermissionError):
        private_folder(str(link))


def test_a_long_log_comes_back_as_its_tail(tmp_path):
    from optuna_saturn.pools.logs import tail

    log = tmp_path / "rank0.log"
    log.write_bytes(b"x" * 5000 + b"the error\n")
    assert tail(log, limit=100).endswith("the error\n") and "first 4910 bytes" in tail(log, limit=100)
    assert tail(log) == "x" * 5000 + "the error\n"
    assert tail(tmp_path / "none.log") == ""


def test_checkpoint_folders_are_private_under_any_umask_and_a_retry_may_load_them(tmp_path):
    """Under umask 002 (Debian's and Ubuntu's default for a user's own group) the checkpoint folders were created
    group-writable, and the sweep refused its own checkpoints: every retried trial started over (review, #9)."""
    import torch

    from optuna_saturn.training.checkpoint_paths import refusal

    class _SingleProcess:  # an engine's context on one process
        class context:
            rank, world_size, strategy = 0, 1, "single"

        checkpoint_format = checkpoint.DCP

    for folder in (tmp_path,):
        os.chmod(folder, 0o755)
    root = tmp_path / "runs" / "checkpoints" / "study-0123"
    before = os.umask(0o002)
    try:
        model = torch.nn.Linear(2, 2)
        record = checkpoint.save(_SingleProcess(), root / "trial-3", 4, model, None, None, group=None)
    finally:
        os.umask(before)
    for folder in (root / "trial-3" / "step-4", root / "trial-3", root, root.parent, root.parent.parent):
        assert oct(folder.stat().st_mode & 0o777) == "0o700", folder
    assert refusal(record.path, root) == ""


def test_the_worker_refuses_a_checkpoint_swapped_for_a_link_after_it_was_planned(tmp_path):
    """The executor checks when it plans a resume; the worker checks again just before it loads: a step folder
    replaced by a link meanwhile (to a tree someone else wrote) is not loaded."""
    from optuna_saturn.training.checkpoint_paths import make_private_folders, refusal

    root = tmp_path / "checkpoints" / "study-0123"
    planned = root / "trial-3" / "step-4"
    make_private_folders(planned)
    os.chmod(tmp_path, 0o755)
    assert refusal(planned, root) == ""
    planted = tmp_path / "planted" / "trial-3" / "step-4"
    planted.mkdir(parents=True)
    planned.rmdir()
    planned.symlink_to(planted)
    assert refusal(planned, root) != ""


def test_a_checkpoint_named_through_a_link_to_the_root_is_refused(tmp_path):
    """A path through someone's link that points at the sweep's own root passed both checks, and the worker then
    loaded wherever the link pointed by then (benchmarks/resume_race.py found it): the path must name the root
    as the sweep does."""
    from optuna_saturn.training.checkpoint_paths import make_private_folders, refusal

    root = tmp_path / "checkpoints" / "study-0123"
    own = root / "trial-3" / "step-4"
    make_private_folders(own)
    os.chmod(tmp_path, 0o755)
    link = tmp_path / "elsewhere"
    link.symlink_to(root)
    assert refusal(own, root) == ""
    assert "not a trial's checkpoint in this study's checkpoint folder" in refusal(link / "trial-3" / "step-4", root)


def test_a_checkpoint_under_a_root_reached_through_the_users_own_link_is_loaded(tmp_path):
    """A $HOME or a log folder that is a link to a data disk: the record holds the resolved path, the sweep names
    the root through the link; both name the sweep's own root."""
    from optuna_saturn.training.checkpoint_paths import make_private_folders, refusal

    disk = tmp_path / "disk"
    make_private_folders(disk / "checkpoints" / "study-0123" / "trial-3" / "step-4")
    os.chmod(tmp_path, 0o755)
    (tmp_path / "home").symlink_to(disk)
    root = tmp_path / "home" / "checkpoints" / "study-0123"
    resolved = (root / "trial-3" / "step-4").resolve()
    assert refusal(resolved, root) == "" and refusal(root / "trial-3" / "step-4", root) == ""
