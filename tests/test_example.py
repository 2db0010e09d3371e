from __future__ import annotations

import os
import subprocess
import sys

import optuna
import pytest
from optuna.trial import TrialState

pytestmark = pytest.mark.launch
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_example_gpt2_sweep_runs_and_continues(saturn_options, tmp_path):
    storage = f"sqlite:///{tmp_path / 'example.sqlite3'}"
    env = {**os.environ, "SATURN_EXAMPLE_DATA": str(tmp_path / "data")}
    command = [sys.executable, os.path.join(ROOT, "examples", "gpt2_sweep.py"), "--n-trials", "2",
               "--storage", storage, "--isolate-network"]
    for _ in range(2):  # the second run continues the same study
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
    assert f"optuna-dashboard {storage}" in done.stdout
    trials = optuna.load_study(study_name="gpt2-tiny", storage=storage).trials
    assert len(trials) == 4
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished) == 4
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert complete and all(3.0 < t.value < 7.7 for t in complete)  # below log(vocab): it learned something
