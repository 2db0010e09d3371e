"""The ``optuna-saturn`` command line, on a real small study and on bad input.

One real sweep (the ``optuna-saturn`` script, each trial in a loopback-only network namespace) is recorded once
per module; ``plan``, ``simulate`` and ``report`` read it. Bad input runs in-process through typer's CliRunner and
must end with a message that names the fix and exit code 2, before anything is created.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from support import require
from typer.testing import CliRunner

from optuna_saturn.cli import app
from optuna_saturn.planner import SOLVERS
from optuna_saturn.report import GRAPH_OBJECT_ID

TESTS = Path(__file__).resolve().parent
OBJECTIVES = TESTS / "objectives.py"
STUDY = "cli-sweep"
runner = CliRunner()


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The installed ``optuna-saturn`` script, as a user runs it."""
    script = shutil.which("optuna-saturn") or str(Path(sys.executable).with_name("optuna-saturn"))
    return subprocess.run([script, *args], capture_output=True, text=True, cwd=cwd, timeout=240)


def invoke(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> str:
    """A storage holding one real sweep of 3 trials on 2 CPU devices, run by ``optuna-saturn run``."""
    require(
        bool(shutil.which("unshare") and shutil.which("ip")),
        "unshare or ip (util-linux, iproute2)",
        fix="they launch trials in a loopback-only network namespace",
    )
    folder = tmp_path_factory.mktemp("cli")
    storage = f"sqlite:///{folder / 'sweep.sqlite3'}"
    result = cli(
        "run",
        f"{OBJECTIVES}:curve",
        "--storage",
        storage,
        "--study",
        STUDY,
        "--n-trials",
        "3",
        "--devices",
        "2",
        "--strategies",
        "single,ddp",
        "--isolate-network",
        "--progress",
        "plain",
        "--log-dir",
        str(folder / "runs"),
        cwd=folder,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return storage


def table_rows(output: str) -> list[list[str]]:
    """The body rows of a rich table, as lists of cell texts."""
    rows = [
        [cell.strip() for cell in line.strip().strip("│").split("│")]
        for line in output.splitlines()
        if line.startswith("│")
    ]
    return rows


# -- run --------------------------------------------------------------------------------------------------------------
@pytest.mark.launch
def test_run_records_a_sweep_and_can_continue_it(recorded: str, tmp_path: Path) -> None:
    study = optuna.load_study(study_name=STUDY, storage=recorded)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    for trial in study.trials:
        assert trial.system_attrs["saturn:strategy"] in ("single", "ddp")
        assert trial.system_attrs["saturn:options"]
    attrs = study._storage.get_study_system_attrs(study._study_id)
    assert any(k.startswith(f"dashboard:plot_data:{GRAPH_OBJECT_ID}:") for k in attrs)  # published by default

    # Started again, on the same study, with the objective given as module:function from its folder.
    again = cli(
        "run",
        "objectives:curve",
        "--storage",
        recorded,
        "--study",
        STUDY,
        "--n-trials",
        "1",
        "--devices",
        "1",
        "--strategies",
        "single",
        "--isolate-network",
        "--quiet",
        "--log-dir",
        str(tmp_path / "runs"),
        cwd=TESTS,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout == ""  # --quiet
    study = optuna.load_study(study_name=STUDY, storage=recorded)
    assert len(study.trials) == 4 and study.trials[-1].state == TrialState.COMPLETE
    started = {t.system_attrs["saturn:sweep_started_at"] for t in study.trials}
    assert len(started) == 2  # two sweeps in one study


# -- plan, simulate, report -------------------------------------------------------------------------------------------
@pytest.mark.launch
def test_plan_prints_a_plan_with_makespan_and_bound(recorded: str) -> None:
    result = invoke("plan", "--storage", recorded, "--study", STUDY, "--nodes", "1,1", "--solver", "greedy")
    assert result.exit_code == 0, result.output
    rows = table_rows(result.output)
    assert sorted(int(r[0]) for r in rows) == [0, 1, 2, 3][: len(rows)] and len(rows) >= 3
    assert {r[4] for r in rows} <= {"0", "1"} and {r[3] for r in rows} == {"1"}  # node index; one micro-batch
    assert all(r[1] == "single" for r in rows)  # ddp needs 2 devices in one node: it cannot run on 1+1
    assert "makespan" in result.output and "lower bound" in result.output


@pytest.mark.launch
def test_simulate_answers_the_fewest_devices_for_a_deadline_and_refuses_one_no_pool_meets(recorded: str) -> None:
    result = invoke(
        "simulate", "--storage", recorded, "--study", STUDY, "--devices", "1,2,4", "--sweep", "1",
        "--deadline", "1h", "--price-per-device-hour", "2",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = {int(r[0]): r for r in table_rows(result.output)}
    assert sorted(rows) == [1, 2, 4] and all(r[4] == "yes" for r in rows.values())
    assert "The fewest devices that meet the deadline: 1 device(s)" in result.output
    hours = float(rows[1][2])
    assert float(rows[1][3]) == pytest.approx(2 * hours, abs=0.011)  # the cost: device-hours at 2 per hour
    tight = invoke("simulate", "--storage", recorded, "--study", STUDY, "--devices", "1,2", "--deadline", "1s")
    assert tight.exit_code != 0 and "No pool of 1, 2 device(s) meets the deadline" in tight.output
    assert "refused (earliest" in tight.output


def test_simulates_old_time_limit_still_works_as_its_work_limit_and_says_it_is_deprecated(recorded: str) -> None:
    args = ("simulate", "--storage", recorded, "--study", STUDY, "--devices", "1", "--sweep", "1")
    new = invoke(*args, "--work-limit", "0.05")
    old = invoke(*args, "--time-limit", "0.05")
    assert new.exit_code == 0 and old.exit_code == 0, old.output
    assert "--time-limit of simulate is deprecated" in old.output and "--work-limit" in old.output
    assert table_rows(old.output) == table_rows(new.output)


@pytest.mark.launch
def test_simulate_replays_the_sweep_on_other_device_counts_and_on_its_own(recorded: str) -> None:
    study = optuna.load_study(study_name=STUDY, storage=recorded)
    result = invoke("simulate", "--storage", recorded, "--study", STUDY, "--devices", "1,2,4", "--sweep", "1")
    assert result.exit_code == 0, result.output
    rows = {int(r[1]): r for r in table_rows(result.output)}
    assert sorted(rows) == [1, 2, 4]
    walls = {n: float(rows[n][2]) for n in rows}
    assert walls[1] >= walls[2] >= walls[4] > 0
    # On one device every trial runs alone with 'single', as long as it really took (observed runtimes), after
    # the sweep's describing and its workers' start.
    alone = 0.0
    for trial in study.trials[:3]:  # (the first sweep's)
        single = next(o["runtime"] for o in trial.system_attrs["saturn:options"] if o["strategy"] == "single")
        attrs = trial.system_attrs
        alone += single * attrs["saturn:actual_runtime"] / attrs["saturn:planned_runtime"]
    assert walls[1] >= alone
    # On its own 2 devices, the simulator says how far it is from the recorded sweep (its last trial's end: the
    # summary with its wall clock was the latest sweep's, and is overwritten)
    assert "the simulator's error" in rows[2][5] and "the simulator's error" not in rows[1][5]
    recorded_end = max(t.system_attrs["saturn:actual_end"] for t in study.trials[:3])
    assert walls[2] == pytest.approx(recorded_end, rel=0.25), (walls[2], recorded_end)


@pytest.mark.launch
def test_report_writes_html_png_summary_and_publishes(recorded: str, tmp_path: Path) -> None:
    from optuna_saturn.report.export import find_chromium

    require(find_chromium() is not None, "Chromium (for PNG export)")
    result = invoke("report", "--storage", recorded, "--study", STUDY, "--out", str(tmp_path), "--publish")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "schedule.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Plotly.newPlot" in (tmp_path / "schedule.html").read_text()
    summary = (tmp_path / "summary.txt").read_text()
    assert "COMPLETE" in summary and "makespan:" in summary and "lower bound" in summary
    assert "utilisation:" in summary and "strategies:" in summary

    from optuna_dashboard import get_note

    assert "Saturn schedule" in get_note(optuna.load_study(study_name=STUDY, storage=recorded))


# -- help and bad input -----------------------------------------------------------------------------------------------
def test_help_lists_every_command() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("run", "plan", "simulate", "report"):
        assert command in result.output
        sub = invoke(command, "--help")
        assert sub.exit_code == 0 and "--storage" in sub.output
    assert "profile" in result.output
    assert "--profile-store" in invoke("profile", "--help").output


@pytest.mark.parametrize("command", ["run", "plan", "simulate"])
def test_solver_help_names_every_backend(command) -> None:
    """The help is built from the planner's own list, so a backend added there (``search`` was missing) shows."""
    words = " ".join(runner.invoke(app, [command, "--help"], terminal_width=200).output.split())
    for solver in SOLVERS:
        assert solver in words.split("Planner backend:")[1].split("[default")[0], solver


@pytest.mark.parametrize("command", ["run", "profile", "plan", "simulate", "report"])
def test_help_is_readable_in_80_columns(command) -> None:
    """Each option's description wraps under a short option column, not into a narrow one on the right."""
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    described = [line for line in lines if line.startswith("  --")]
    assert described, result.output
    # every option line that carries a description starts it by column 34, leaving it 46 columns or more
    starts = [len(line) - len(line.lstrip()) for line in lines if line.startswith(" " * 20) and line.strip()]
    assert starts and max(starts) <= 34, result.output


@pytest.mark.launch
def test_profile_fills_the_store_and_prints_the_table(tmp_path: Path) -> None:
    require(
        bool(shutil.which("unshare") and shutil.which("ip")),
        "unshare or ip (util-linux, iproute2)",
        fix="they launch trials in a loopback-only network namespace",
    )
    store = tmp_path / "profiles"
    result = cli(
        "profile",
        f"{OBJECTIVES}:profiled",
        "--n-trials",
        "2",
        "--devices",
        "2",
        "--strategies",
        "single,ddp",
        "--profile-store",
        str(store),
        "--isolate-network",
        "--log-dir",
        str(tmp_path / "runs"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [r for r in table_rows(result.stdout) if r[0]]  # (a long params cell folds onto a row of its own)
    assert sorted((r[2], r[3]) for r in rows) == (
        [("ddp ×2", "1")] * 2 + [("single ×1", "1")] * 2  # one micro-batch: the batch fits
    )
    assert all(float(r[4]) > 0 and float(r[7]) > 0 for r in rows)  # a step time, a whole trial's runtime
    assert len(list(store.glob("*.json"))) == 2  # the two trials differ only in lr: measured once each


def test_profile_table_shows_learned_profiles_in_80_columns() -> None:
    """A profile learned from a real run has no peak memory (most of a store after a sweep), and one that did not
    fit has no step time: each is a row with "-" for what it lacks, and the table fits 80 columns uncut."""
    import io

    from rich.console import Console

    from optuna_saturn.cli.profile_table import profile_table

    learned = {
        "strategy": "fsdp-ckpt",
        "devices": 2,
        "feasible": True,
        "step_seconds": 0.0512,
        "startup_seconds": None,
        "peak_memory_bytes": None,
        "observed_step_seconds": 0.05,
    }
    timed = {
        "strategy": "zero3-offload",
        "devices": 2,
        "feasible": True,
        "step_seconds": 0.1,
        "startup_seconds": 2.5,
        "peak_memory_bytes": 300 * 2**20,
        "gradient_accumulation": 4,
    }
    refused = {
        "strategy": "single",
        "devices": 1,
        "feasible": False,
        "step_seconds": None,
        "startup_seconds": None,
        "peak_memory_bytes": None,
        "error": "out of memory",
    }
    trial = optuna.trial.create_trial(
        params={"learning_rate": 0.000123456, "width": 256},
        distributions={
            "learning_rate": optuna.distributions.FloatDistribution(1e-5, 1e-2, log=True),
            "width": optuna.distributions.IntDistribution(64, 512),
        },
        value=1.0,
        user_attrs={
            "saturn:profiles": [learned, timed, refused],
            "saturn:options": [
                {"strategy": "fsdp-ckpt", "devices": 2, "runtime": 12.34},
                {"strategy": "zero3-offload", "devices": 2, "runtime": 56.7, "gradient_accumulation": 4},
            ],
        },
    )
    out = io.StringIO()
    Console(file=out, width=80).print(profile_table([trial], title="Profiles in profiles"))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in out.getvalue(), out.getvalue()
    rows = [[c.strip() for c in line.strip("│").split("│")] for line in lines if line.startswith("│")]
    body = [r for r in rows if r[0]]  # (a folded params cell continues on a row with an empty trial cell)
    assert [r[2:] for r in body] == [
        ["fsdp-ckpt ×2", "1", "51.2", "-", "-", "12.3"],
        ["zero3-offload ×2", "4", "100", "2.5", "300", "56.7"],
        ["single ×1", "1", "-", "-", "-", "no fit"],
    ], out.getvalue()


def test_profile_explains_an_objective_it_cannot_profile(tmp_path: Path) -> None:
    message = error_of(
        invoke(
            "profile",
            f"{OBJECTIVES}:quadratic",
            "--devices",
            "1",
            "--strategies",
            "single",
            "--profile-store",
            str(tmp_path / "p"),
            "--log-dir",
            str(tmp_path / "runs"),
        )
    )
    assert "trial.steps" in message


def error_of(result) -> str:
    assert result.exit_code == 2, result.output
    return " ".join(result.output.split())  # rich may wrap lines


def test_missing_function(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    message = error_of(invoke("run", f"{OBJECTIVES}:no_such_function", "--storage", storage))
    assert "No function 'no_such_function'" in message and "quadratic" in message  # lists what is there
    message = error_of(invoke("run", f"{tmp_path / 'missing.py'}:f", "--storage", storage))
    assert "does not exist" in message
    message = error_of(invoke("run", "objectives", "--storage", storage))
    assert "path/to/file.py:function or module:function" in message
    assert not (tmp_path / "s.db").exists()  # nothing was created


@pytest.mark.parametrize(
    "bad, says",
    [
        (["--storage", "sweep.db"], "Malformed storage URL"),
        (["--storage", "sqlite:////no/such/folder/s.db"], "No folder"),
        (["--devices", "99"], "--devices 2"),
        (["--devices", "99"], "--allow-shared-cores"),
        (["--strategies", "single,nope"], "Unknown strategy 'nope'"),
        (["--solver", "nope"], "--solver must be one of"),
        (["--deadline", "0"], "deadline must be a positive duration"),
        (["--deadline", "banana"], "deadline must be seconds or a duration"),
        (["--sampler", "NoSuchSampler"], "NoSuchSampler"),
    ],
)
def test_bad_arguments_are_answered_before_the_objective_is_imported(tmp_path: Path, bad, says) -> None:
    """Every argument the command line can judge without the user's code is judged first: the objective's module
    (whose imports take seconds) is never imported, and nothing is created in the storage's folder."""
    (tmp_path / "marked.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('imported').touch()\n\n"
        "def objective(trial):\n    return 0.0\n"
    )
    args = [
        "run",
        f"{tmp_path / 'marked.py'}:objective",
        "--storage",
        f"sqlite:///{tmp_path / 's.db'}",
        "--devices",
        "2",
    ]
    result = cli(*args, *bad, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert says in " ".join(result.stderr.split()), result.stderr
    assert not (tmp_path / "imported").exists() and not (tmp_path / "s.db").exists()


def test_an_objective_whose_imports_are_missing_is_a_usage_error(tmp_path: Path) -> None:
    """A package the objective's module imports, or the module's own package, not installed: a message and exit 2,
    not a traceback."""
    (tmp_path / "needs.py").write_text("import no_such_package_here\n\ndef objective(trial):\n    return 0.0\n")
    storage = f"sqlite:///{tmp_path / 's.db'}"
    message = error_of(invoke("run", f"{tmp_path / 'needs.py'}:objective", "--storage", storage))
    assert "no_such_package_here" in message and "not installed" in message
    message = error_of(invoke("run", "nopkg.train:objective", "--storage", storage))
    assert "Cannot import module 'nopkg.train'" in message


def test_malformed_storage_url(tmp_path: Path) -> None:
    message = error_of(invoke("run", f"{OBJECTIVES}:quadratic", "--storage", "sweep.db", "--devices", "1"))
    assert "Malformed storage URL" in message and "sqlite:///" in message
    message = error_of(invoke("plan", "--storage", "sqlite:/x.db"))
    assert "Malformed storage URL" in message
    message = error_of(invoke("report", "--storage", f"sqlite:///{tmp_path / 'nope.db'}"))
    assert "No database file" in message and not (tmp_path / "nope.db").exists()
    message = error_of(invoke("run", f"{OBJECTIVES}:quadratic", "--storage", "sqlite:///:memory:", "--devices", "1"))
    assert "in-memory SQLite database" in message and "sqlite:///sweep.sqlite3" in message


def test_more_devices_than_exist(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    message = error_of(invoke("run", f"{OBJECTIVES}:quadratic", "--storage", storage, "--devices", "1000"))
    assert "1000" in message and ("or fewer" in message or "Pass devices=" in message)
    assert not (tmp_path / "s.db").exists()


def test_unknown_strategy(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    message = error_of(
        invoke(
            "run",
            f"{OBJECTIVES}:quadratic",
            "--storage",
            storage,
            "--devices",
            "1",
            "--strategies",
            "single,warp-drive",
        )
    )
    assert "Unknown strategy 'warp-drive'" in message and "single" in message
    assert not (tmp_path / "s.db").exists()


def test_study_that_does_not_exist(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    optuna.create_study(storage=storage, study_name="there")
    for command in ("plan", "simulate", "report"):
        message = error_of(invoke(command, "--storage", storage, "--study", "not-there"))
        assert "Study 'not-there' does not exist" in message and "Studies there: there." in message


def test_study_without_saturn_trials(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    optuna.create_study(storage=storage, study_name="plain").optimize(lambda t: t.suggest_float("x", 0, 1), 2)
    message = error_of(invoke("plan", "--storage", storage, "--devices", "2"))  # the only study is picked
    assert "saturn:options" in message and "optuna-saturn run" in message


def test_help_and_version_start_without_torch() -> None:
    """``optuna-saturn --help`` answered in 4-7 s when the command line imported torch: it, and the package's
    own import, load neither torch nor DeepSpeed (0.3-0.4 s here)."""
    probe = (
        "import sys\n"
        "import optuna_saturn, optuna_saturn.cli\n"
        "from typer.testing import CliRunner\n"
        "for args in (['--help'], ['run', '--help'], ['--version']):\n"
        "    result = CliRunner().invoke(optuna_saturn.cli.app, args)\n"
        "    assert result.exit_code == 0, result.output\n"
        "heavy = sorted(m for m in ('torch', 'deepspeed', 'transformers', 'lightning') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
        "print(result.output)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("optuna-saturn 0.1.0 (optuna ")


def test_every_command_shows_examples_in_its_help() -> None:
    for command in ("run", "profile", "plan", "simulate", "report"):
        output = invoke(command, "--help").output
        assert f"Examples:\n    optuna-saturn {command} " in output, output
