"""A pool kind, strategies and an engine from another installed distribution (entry points), as a team would ship
them: the plug-in package in ``tests/plugin_package`` is installed, and sweeps run with them, named by ``runner=``
and ``strategies=`` alone."""

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


def _installed_plug_in(tmp_path) -> str:
    """The plug-in package installed into a folder of its own (its entry points with it); that folder."""
    site, source = tmp_path / "site", tmp_path / "plugin"
    shutil.copytree(os.path.join(HERE, "plugin_package"), source)  # (a build writes beside its sources)
    install = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    built = subprocess.run(
        [*install, "--target", str(site), str(source)], capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return str(site)


def _result_of(script, site: str, tmp_path) -> dict:
    """Runs a sweep's script with the plug-in installed; what it printed after ``RESULT ``."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([site, HERE, os.environ.get("PYTHONPATH", "")])}
    ran = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path, env=environment
    )
    lines = [line for line in ran.stdout.splitlines() if line.startswith("RESULT ")]
    assert ran.returncode == 0 and lines, ran.stdout[-3000:] + ran.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_a_pool_and_a_strategy_from_an_installed_plug_in_run_a_sweep(tmp_path, saturn_options):
    site = _installed_plug_in(tmp_path)
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
    result = _result_of(script, site, tmp_path)
    assert result["pool"] == "saturn_plugin_demo.pool"
    assert result["trials"] == [["COMPLETE", "solo", ["cpu:0"]]] * 3


def test_a_strategy_whose_engine_comes_from_a_plug_in_runs_a_trial_under_that_engine(tmp_path, saturn_options):
    """The plug-in's ``demo-ddp`` template names the plug-in's own engine (DDP under another name, found through
    the ``optuna_saturn.engines`` entry point): the template is accepted, and its trial trains on two processes,
    prepared by that engine, to COMPLETE; nothing in optuna-saturn names it."""
    site = _installed_plug_in(tmp_path)
    script = tmp_path / "sweep.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, optuna
            from optuna_saturn import SaturnExecutor
            from optuna_saturn.strategy import load_strategies
            from saturn_plugin_demo.objective import records_its_engine

            study = optuna.create_study(storage="sqlite:///{tmp_path / "s.db"}")
            executor = SaturnExecutor(
                devices=2, strategies=["demo-ddp"], isolate_network=True, log_dir="{tmp_path / "runs"}",
                profile_store="{tmp_path / "profiles"}", progress="plain", dashboard=False, grace_period=5.0,
            )
            executor.optimize(study, records_its_engine, n_trials=1)
            print("RESULT " + json.dumps({{
                "engine": load_strategies()["demo-ddp"].engine,
                "trials": [
                    [t.state.name, t.system_attrs.get("saturn:strategy"), len(t.system_attrs.get("saturn:devices"))]
                    + [t.user_attrs.get(k) for k in ("prepared_by", "wrapper", "world_size")]
                    for t in study.trials
                ],
            }}))
            """
        )
    )
    result = _result_of(script, site, tmp_path)
    assert result["engine"] == "demo-ddp"
    assert result["trials"] == [["COMPLETE", "demo-ddp", 2, "demo-ddp", "DistributedDataParallel", 2]]
