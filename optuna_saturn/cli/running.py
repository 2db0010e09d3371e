"""``optuna-saturn run`` and ``profile``: sweeps and measurements, on this machine's devices or a Ray cluster's."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import optuna
import typer

from optuna_saturn.cli.app import (
    INTERRUPTED,
    DevicesOption,
    IsolateOption,
    LogDirOption,
    ProfileStoreOption,
    RayAddressOption,
    RunnerOption,
    SolverOption,
    StorageOption,
    StrategiesOption,
    StrategyFolderOption,
    app,
    console,
    fail,
    ints,
    open_storage,
    split,
)
from optuna_saturn.progress import PROGRESS_MODES, RichProgress, make_progress
from optuna_saturn.study.urls import without_password


@app.command()
def run(
    objective: Annotated[
        str,
        typer.Argument(
            help="The objective: path/to/file.py:function or package.module:function. Its file is imported, not run, "
            'so keep sweep-starting code under `if __name__ == "__main__":`.',
            show_default=False,
        ),
    ],
    storage: StorageOption,
    study: Annotated[
        str, typer.Option("--study", help="Study name; created when missing, continued otherwise.")
    ] = "saturn",
    n_trials: Annotated[
        int | None, typer.Option("--n-trials", min=0, help="Trials to add (counts new trials, like study.optimize).")
    ] = None,
    devices: DevicesOption = "auto",
    strategies: StrategiesOption = None,
    strategy_folder: StrategyFolderOption = None,
    timeout: Annotated[
        float | None, typer.Option("--timeout", min=0.001, help="Stop asking for new trials after this many seconds.")
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch-size",
            min=1,
            help="Look-ahead: how many asked trials may wait for devices (default: the number of devices).",
        ),
    ] = None,
    solver: SolverOption = "auto",
    direction: Annotated[
        str, typer.Option("--direction", help="minimize or maximize; used when the study is created.")
    ] = "minimize",
    isolate_network: IsolateOption = False,
    log_dir: LogDirOption = Path("saturn-runs"),
    profile: Annotated[
        bool,
        typer.Option(
            "--profile/--no-profile", help="Measure each trial's options with short real runs before planning."
        ),
    ] = True,
    profile_store: ProfileStoreOption = Path("profiles"),
    profile_budget: Annotated[
        float | None,
        typer.Option(
            "--profile-budget", min=0.001, help="Seconds of profiling allowed per batch; the rest is estimated."
        ),
    ] = None,
    progress: Annotated[
        str,
        typer.Option(
            "--progress", help="Live progress: auto (a table on a terminal, log lines otherwise), rich, plain, quiet."
        ),
    ] = "auto",
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet", "-q", help="No progress display and only warnings in the log (same as --progress quiet)."
        ),
    ] = False,
    dashboard: Annotated[
        bool | None,
        typer.Option(
            "--dashboard/--no-dashboard",
            help="Keep a schedule chart and a plan note on the study for "
            "optuna-dashboard, updated as the sweep runs. Default: on when optuna-dashboard is installed.",
            show_default=False,
        ),
    ] = None,
    elastic: Annotated[
        bool,
        typer.Option(
            "--elastic/--no-elastic",
            help="Move a running trial that checkpoints to another strategy or device count "
            "when the sweep then ends sooner (elastic resize).",
        ),
    ] = True,
    runner: RunnerOption = "local",
    ray_address: RayAddressOption = None,
) -> None:
    """Run a sweep: add --n-trials trials to the study, each planned and launched on the device pool."""
    if progress not in PROGRESS_MODES:
        fail(f"--progress must be one of {', '.join(PROGRESS_MODES)}, got {progress!r}.")
    if direction not in ("minimize", "maximize"):
        fail(f"--direction must be minimize or maximize, got {direction!r}.")
    mode = "quiet" if quiet else progress
    function = load_objective(objective)
    view = make_progress(mode)  # type: ignore[arg-type]
    listeners: list[Any] = [view]
    publisher = _dashboard_publisher(dashboard)
    if publisher is not None:
        listeners.append(publisher)
    try:
        executor = _executor(
            devices,
            strategies,
            strategy_folder,
            isolate_network,
            log_dir,
            solver=solver,
            listeners=listeners,
            profile=profile,
            profile_store=profile_store,
            profile_budget=profile_budget,
            elastic=elastic,
            runner=runner,
            ray_address=ray_address if runner == "ray" else None,
        )
    except (ValueError, TypeError, ImportError, ConnectionError) as exc:  # StrategyError is a ValueError
        fail(str(exc))
    verbosity = optuna.logging.get_verbosity()
    if not isinstance(view, RichProgress):  # plain or quiet: our lines replace Optuna's per-trial INFO lines
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        the_study = optuna.create_study(
            storage=open_storage(storage), study_name=study, direction=direction, load_if_exists=True
        )
        executor.optimize(the_study, function, n_trials=n_trials, timeout=timeout, batch_size=batch_size)
    except KeyboardInterrupt:
        typer.echo("Interrupted: running trials were stopped and recorded as FAIL.", err=True)
        raise typer.Exit(INTERRUPTED) from None
    finally:
        optuna.logging.set_verbosity(verbosity)
    if mode != "quiet":
        _print_outcome(the_study, storage)


def _dashboard_publisher(requested: bool | None) -> Any:
    if requested is False:
        return None
    try:
        from optuna_saturn.report.dashboard import DashboardPublisher

        return DashboardPublisher()
    except ImportError as exc:
        if requested:
            fail(
                f"--dashboard needs optuna-dashboard and plotly ({exc}): pip install 'optuna-saturn[dashboard]', "
                "or pass --no-dashboard."
            )
        return None


def _print_outcome(study: optuna.Study, storage: str) -> None:
    from optuna_saturn.report import format_summary, read_study

    sweeps = read_study(study)
    typer.echo(format_summary(sweeps[-1:]))
    try:
        best = study.best_trials
    except ValueError:
        best = []
    for trial in best[:3]:
        typer.echo(f"Best trial #{trial.number}: value(s) {trial.values} with {trial.params}")
    shown = without_password(storage)
    typer.echo(
        f"See the sweep:  optuna-dashboard {shown}    or    optuna-saturn report --storage {shown} "
        f"--study {study.study_name}"
    )


@app.command()
def profile(
    objective: Annotated[
        str,
        typer.Argument(
            help="The objective, as for `run`. It must use trial.prepare(...) and trial.steps(n).", show_default=False
        ),
    ],
    n_trials: Annotated[int, typer.Option("--n-trials", min=1, help="Sampled configurations to profile.")] = 4,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random sampler that draws them.")] = 0,
    devices: DevicesOption = "auto",
    strategies: StrategiesOption = None,
    strategy_folder: StrategyFolderOption = None,
    profile_store: ProfileStoreOption = Path("profiles"),
    isolate_network: IsolateOption = False,
    log_dir: LogDirOption = Path("saturn-runs"),
) -> None:
    """Profile only: measure sampled configurations under every feasible strategy and device count, fill the
    profile store, and print the table. Runs no trial and writes nothing to any study."""
    function = load_objective(objective)
    try:
        executor = _executor(
            devices, strategies, strategy_folder, isolate_network, log_dir, profile_store=profile_store, progress=None
        )
    except (ValueError, TypeError) as exc:
        fail(str(exc))
    try:
        measured = executor.profile(function, n_trials, seed=seed)
    except KeyboardInterrupt:
        raise typer.Exit(INTERRUPTED) from None
    if not any(t.user_attrs.get("saturn:profiles") for t in measured.trials):
        fail(
            "Nothing could be profiled: the objective must build its model and data loader, call "
            "trial.prepare(model, optimizer, loader), then loop over trial.steps(n)."
        )
    from rich.table import Table

    table = Table(title=f"Profiles in {profile_store}")
    columns = (
        "trial",
        "params",
        "strategy",
        "devices",
        "micro-batches",
        "ms/step",
        "start-up s",
        "peak MiB",
        "fits",
        "trial s",
    )
    for column in columns:
        table.add_column(column, justify="left" if column in ("params", "strategy") else "right")
    for trial in measured.trials:
        runtimes = {
            (o["strategy"], o["devices"], o.get("gradient_accumulation", 1)): o["runtime"]
            for o in trial.user_attrs.get("saturn:options", [])
        }
        for p in trial.user_attrs.get("saturn:profiles", []):
            ok = p["feasible"]
            accumulation = p.get("gradient_accumulation", 1)
            table.add_row(
                str(trial.number),
                ", ".join(f"{k}={_short(v)}" for k, v in trial.params.items()),
                p["strategy"],
                str(p["devices"]),
                str(accumulation),
                f"{p['step_seconds'] * 1e3:.1f}" if ok else "-",
                f"{p['startup_seconds']:.1f}" if ok else "-",
                f"{p['peak_memory_bytes'] / 2**20:.0f}" if ok else "-",
                "yes" if ok else "no",
                f"{runtimes[(p['strategy'], p['devices'], accumulation)]:.1f}" if ok else "-",
            )
    console().print(table)


def _executor(
    devices: str,
    strategies: str | None,
    strategy_folder: list[Path] | None,
    isolate_network: bool,
    log_dir: Path,
    **options: Any,
) -> Any:
    """The executor for the options `run` and `profile` share; progress and the dashboard are the CLI's own."""
    from optuna_saturn import SaturnExecutor

    options.setdefault("progress", None)
    return SaturnExecutor(
        devices=parse_devices(devices),
        strategies=split(strategies) if strategies else None,
        strategy_folders=strategy_folder or (),
        isolate_network=isolate_network,
        log_dir=log_dir,
        dashboard=False,
        **options,
    )


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def load_objective(spec: str) -> Callable[..., Any]:
    """``path/to/file.py:function`` or ``package.module:function``, importable again by worker processes.

    A file is imported under its own module name with its folder put first on ``sys.path``; the executor passes
    ``sys.path`` to the workers, so they import the same module by name. Its ``__main__`` block does not run.
    """
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        fail(f"Cannot read the objective {spec!r}: give it as path/to/file.py:function or module:function.")
    if target.endswith(".py") or os.sep in target or "/" in target:
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            fail(f"Objective file {target!r} does not exist (looked for {path}).")
        module_name = path.stem
        if not module_name.isidentifier():
            fail(
                f"Objective file {path.name!r} cannot be imported by workers: rename it to a valid Python module "
                "name (letters, digits, underscores)."
            )
        sys.path.insert(0, str(path.parent))
        module = _import(module_name, spec)
        loaded_from = Path(getattr(module, "__file__", "") or "").resolve()
        if loaded_from != path:
            fail(
                f"The module name {module_name!r} of {str(path)!r} is taken by {str(loaded_from)!r}; rename "
                "your file so that workers import the right one."
            )
    else:
        if os.getcwd() not in sys.path:  # like `python -m`: modules in the current folder are found
            sys.path.insert(0, os.getcwd())
        module = _import(target, spec)
    function = module
    for part in name.split("."):
        function = getattr(function, part, None)
        if function is None:
            found = sorted(
                k
                for k, v in vars(module).items()
                if callable(v) and getattr(v, "__module__", "") == module.__name__ and not k.startswith("_")
            )
            fail(f"No function {name!r} in {target!r}. Functions defined there: {', '.join(found) or 'none'}.")
    if not callable(function):
        fail(f"{spec!r} is not a function but a {type(function).__name__}.")
    return function  # type: ignore[return-value]


def _import(module_name: str, spec: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            fail(
                f"Cannot import module {module_name!r} for {spec!r}: run from the folder that contains it, put it on "
                "PYTHONPATH, or give the objective as path/to/file.py:function."
            )
        raise


def parse_devices(text: str) -> Any:
    """``"4"`` -> 4; ``"0,1"`` -> [0, 1]; ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cpu:8"`` stay strings."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    if "," in text:
        return ints(text, "--devices")
    return text
