"""``optuna-saturn run --sampler/--sampler-args/--pruner/--pruner-args/--seed``: the user's sampler and pruner from
the shell, as ``study.optimize`` would get them in Python; bad input named with its fix, exit code 2."""

from __future__ import annotations

import optuna
import pytest
import typer
from test_cli import OBJECTIVES, cli, invoke

from optuna_saturn.cli.study_options import make_pruner, make_sampler


def test_samplers_and_pruners_by_name_with_their_arguments_and_the_seed():
    sampler = make_sampler("TPESampler", '{"n_startup_trials": 3}', 7)
    assert isinstance(sampler, optuna.samplers.TPESampler)
    assert sampler._n_startup_trials == 3
    assert isinstance(make_sampler("optuna.samplers.RandomSampler", None, None), optuna.samplers.RandomSampler)
    assert isinstance(make_sampler(None, None, 0), optuna.samplers.TPESampler)  # --seed alone: Optuna's default
    assert make_sampler(None, None, None) is None
    pruner = make_pruner("MedianPruner", '{"n_warmup_steps": 4}')
    assert isinstance(pruner, optuna.pruners.MedianPruner) and pruner._n_warmup_steps == 4
    assert isinstance(make_pruner("none", None), optuna.pruners.NopPruner)
    assert make_pruner(None, None) is None


def test_a_sampler_from_the_users_own_file(tmp_path):
    (tmp_path / "my_sampling.py").write_text(
        "import optuna\n\ndef make(seed=None, flavour='plain'):\n"
        "    sampler = optuna.samplers.RandomSampler(seed=seed)\n    sampler.flavour = flavour\n    return sampler\n"
    )
    sampler = make_sampler(f"{tmp_path / 'my_sampling.py'}:make", '{"flavour": "mine"}', 3)
    assert isinstance(sampler, optuna.samplers.RandomSampler) and sampler.flavour == "mine"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sampler", "TPESamplr"], "is not one of Optuna's: "),
        (["--sampler", "TPESampler", "--sampler-args", "{seed: 0}"], "is not JSON"),
        (["--sampler", "TPESampler", "--sampler-args", "[0]"], "must be a JSON object"),
        (["--sampler", "TPESampler", "--sampler-args", '{"n_startup": 3}'], "It takes: TPESampler("),
        (["--sampler-args", '{"seed": 0}'], "--sampler-args needs --sampler"),
        (["--sampler", "PartialFixedSampler", "--seed", "1"], "PartialFixedSampler takes no seed"),
        (["--sampler", "TPESampler", "--sampler-args", '{"seed": 1}', "--seed", "2"], "give the seed once"),
        (["--pruner", "MedianPrunr"], "is not one of Optuna's: "),
        (["--pruner", "no_such_module.Pruner"], "cannot import"),
    ],
)
def test_bad_sampler_or_pruner_input_names_the_fix(args, message, tmp_path):
    result = invoke("run", f"{OBJECTIVES}:curve", "--storage", f"sqlite:///{tmp_path / 's.db'}", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output, result.output
    assert not (tmp_path / "s.db").exists()  # nothing created before the input was checked


def test_make_sampler_fails_with_typer_exit_code_2():
    with pytest.raises(typer.Exit) as raised:
        make_sampler("NotASampler", None, None)
    assert raised.value.exit_code == 2


@pytest.mark.launch
def test_run_uses_the_named_sampler_its_arguments_and_the_seed(tmp_path):
    """The study records that sampler's trials: a grid's points, each once; a seeded random sampler's draws, the
    same as plain Optuna's with that seed (one device: trials asked one after another, as study.optimize does)."""
    grid = f"sqlite:///{tmp_path / 'grid.db'}"
    result = cli(
        "run", f"{OBJECTIVES}:curve", "--storage", grid, "--study", "grid", "--n-trials", "3", "--devices", "2",
        "--strategies", "single", "--isolate-network", "--quiet", "--log-dir", str(tmp_path / "runs"),
        "--sampler", "GridSampler", "--sampler-args", '{"search_space": {"offset": [1.0, 2.0, 3.0]}}',
        "--pruner", "none",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    trials = optuna.load_study(study_name="grid", storage=grid).trials
    assert sorted(t.params["offset"] for t in trials) == [1.0, 2.0, 3.0]
    assert all("grid_id" in t.system_attrs for t in trials)

    seeded = f"sqlite:///{tmp_path / 'seeded.db'}"
    result = cli(
        "run", f"{OBJECTIVES}:curve", "--storage", seeded, "--study", "seeded", "--n-trials", "3", "--devices", "1",
        "--strategies", "single", "--isolate-network", "--quiet", "--log-dir", str(tmp_path / "runs"),
        "--sampler", "RandomSampler", "--seed", "5",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    plain = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=5))
    plain.optimize(lambda t: t.suggest_float("offset", 0.0, 100.0), n_trials=3)
    ours = optuna.load_study(study_name="seeded", storage=seeded).trials
    assert [t.params["offset"] for t in ours] == [t.params["offset"] for t in plain.trials]
