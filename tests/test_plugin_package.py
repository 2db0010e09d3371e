"""A pool kind and a strategy from another installed distribution (entry points), as a team would ship them: the
plug-in package in ``tests/plugin_package`` is installed, and a sweep runs with both, named by ``runner=`` and
``strategies=`` alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(__file__)

pytestmark = pytest.mark.launch


def test_a_pool_and_a_strategy_from_an_installed_plug_in_run_a_sweep(tmp_path, saturn_options):
    site, source = tmp_path / "site", tmp_path / "plugin"
    shutil.copytree(os.path.join(HERE, "plugin_package"), source)  # (a build writes beside its sources)
    install = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    built = subprocess.run(
        [*install, "--target", str(site), str(source)], capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    assert built.returncode == 0, built.stdout + built.stderr
    script = tmp_path / "sweep.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, optuna, objectives
            from optuna_saturn import SaturnExecutor

            study = optuna.create_study(storage="sqlite:///{tmp_path / "s.db"}")
            executor = SaturnExecutor(
                devices=2, runner="first-device", strategies=["solo"], isolate_network=True,
                log_dir="{tmp_path / "runs"}", profile_store="{tmp_path / "profiles"}", progress="plain",
                dashboard=False, grace_period=5.0,
            )
            executor.optimize(study, objectives.quadratic, n_trials=3)
            print("RESULT " + json.dumps({{
                "pool": type(executor.pool).__module__,
                "trials": [
                    [t.state.name, t.system_attrs.get("saturn:strategy"), t.system_attrs.get("saturn:devices")]
                    for t in study.trials
                ],
            }}))
            """
        )
    )
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), HERE, os.environ.get("PYTHONPATH", "")])}
    ran = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path, env=environment
    )
    lines = [line for line in ran.stdout.splitlines() if line.startswith("RESULT ")]
    assert ran.returncode == 0 and lines, ran.stdout[-3000:] + ran.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["pool"] == "saturn_plugin_demo.pool"
    assert result["trials"] == [["COMPLETE", "solo", ["cpu:0"]]] * 3
