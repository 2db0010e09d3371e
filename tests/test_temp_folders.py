"""A killed executor's temporary folder is removed by the next sweep on the machine, once its owner is gone, and
only then (issue 47, N12): judged by pid and start time, and only this user's folders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

from optuna_saturn.channel import ChannelServer
from optuna_saturn.process_ids import start_ticks
from optuna_saturn.temp_folders import OWNER_FILE, make_sweep_folder, remove_dead_sweeps_folders

KILLED = "from optuna_saturn.temp_folders import make_sweep_folder; import os; print(make_sweep_folder()); os._exit(9)"


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    """The temporary directory the sweeps of this test use (``tempfile.gettempdir()``, and ``TMPDIR`` for the
    processes it starts)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path


def _killed_executors_folder() -> str:
    """The folder of an executor that exited without removing it (as ``kill -9`` leaves it)."""
    done = subprocess.run([sys.executable, "-c", KILLED], capture_output=True, text=True, timeout=120)
    assert done.returncode == 9, done.stderr
    folder = done.stdout.strip()
    assert os.path.isdir(folder)
    return folder


def test_the_next_sweep_removes_a_killed_executors_folder_and_leaves_a_live_ones(temp_dir):
    dead = _killed_executors_folder()
    live = make_sweep_folder()  # (this process's: alive)
    with ChannelServer() as server:  # (every sweep's first move on the machine)
        assert not os.path.exists(dead)
        assert os.path.isdir(live) and os.path.isdir(server.folder)
        assert server.folder.startswith(str(temp_dir))
    assert not os.path.exists(server.folder)  # (its own, removed at its end as before)


def test_a_folder_whose_pid_was_given_to_a_later_process_is_removed(temp_dir):
    """The pid alone would keep it: this process lives, but it is not the one that started at those ticks."""
    reused = make_sweep_folder()
    owner_file = os.path.join(reused, OWNER_FILE)
    with open(owner_file, encoding="utf-8") as f:
        owner = json.load(f)
    owner["ticks"] = start_ticks(os.getpid()) - 1
    with open(owner_file, "w", encoding="utf-8") as f:
        json.dump(owner, f)
    assert remove_dead_sweeps_folders() == [reused]
    assert not os.path.exists(reused)


def test_folders_that_are_not_a_dead_sweeps_of_this_user_are_left_alone(temp_dir):
    dead = _killed_executors_folder()
    no_owner = temp_dir / "optuna-saturn-abcd1234"  # (being made now, or by an earlier version)
    no_owner.mkdir()
    other_namespace = temp_dir / "optuna-saturn-efgh5678"
    other_namespace.mkdir()
    with open(os.path.join(dead, OWNER_FILE), encoding="utf-8") as f:
        owner = json.load(f)
    (other_namespace / OWNER_FILE).write_text(json.dumps({**owner, "pid_namespace": "pid:[1]"}))
    leases = temp_dir / "optuna-saturn-leases"
    leases.mkdir()
    link = temp_dir / "optuna-saturn-link1234"
    link.symlink_to(dead)
    kept = [no_owner, other_namespace, leases, link]
    if os.getuid() == 0:  # (another user's dead sweep: not this user's to remove)
        theirs = temp_dir / "optuna-saturn-theirs12"
        theirs.mkdir()
        (theirs / OWNER_FILE).write_text(json.dumps(owner))
        os.chown(theirs, 1001, 1001)
        kept.append(theirs)
    assert remove_dead_sweeps_folders() == [dead]
    assert all(os.path.lexists(path) for path in kept)
