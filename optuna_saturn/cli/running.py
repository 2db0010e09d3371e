"""``optuna-saturn run`` and ``profile``: sweeps and measurements, on this machine's devices or a Ray cluster's."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, TypeGuard

import optuna
import typer

from optuna_saturn.cli.app import (
    INTERRUPTED,
    BudgetOption,
    DeadlineOption,
    DevicesOption,
    IsolateOption,
    LogDirOption,
    PoolOption,
    PriceOption,
    ProfileStoreOption,
    RayAddressOption,
    RunnerOption,
    SharedCoresOption,
    SolverOption,
    StorageOption,
    StrategiesOption,
    StrategyFolderOption,
    app,
    examples,
    fail,
    ints,
    open_storage,
    pool_arguments,
    split,
)
from optuna_saturn.cli.checks import check_storage_url, check_sweep_options
from optuna_saturn.cli.loading import load_objective
from optuna_saturn.cli.study_options import make_pruner, make_sampler
from optuna_saturn.planner import DeadlineUnreachable
from optuna_saturn.progress import PROGRESS_MODES, ProgressMode, RichProgress, make_progress
from optuna_saturn.study.records import record
from optuna_saturn.study.urls import without_password


@app.command(
    epilog=examples(
        "optuna-saturn run train.py:objective --storage sqlite:///s.db \\",
        "    --study demo --n-trials 20",
        "optuna-saturn run train.py:objective --storage sqlite:///s.db \\",
        "    --study demo --n-trials 20 --sampler TPESampler \\",
        "    --sampler-args '{\"multivariate\": true}' --seed 0 --pruner MedianPruner",
        "optuna-saturn run mypackage.train:objective --devices 0,1,2,3 \\",
        "    --storage postgresql://user@host/db --strategies single,ddp,fsdp \\",
        "    --timeout 3600",
    )
)
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
        str, typer.Option("--study", "--study-name", help="Study name; created when missing, continued otherwise.")
    ] = "saturn",
    n_trials: Annotated[
        int | None,
        typer.Option(
            "--n-trials",
            min=0,
            help="Trials to add (counts new trials, like study.optimize). Without it, and without --timeout, "
            "the sweep runs until Ctrl-C or study.stop().",
        ),
    ] = None,
    sampler: Annotated[
        str | None,
        typer.Option(
            "--sampler",
            help="The study's sampler: a class of optuna.samplers (TPESampler, RandomSampler, GridSampler, ...), "
            "a dotted path (optuna_integration.BoTorchSampler), or your own, path/to/file.py:ClassOrFunction. "
            "Default: Optuna's (TPE).",
            show_default=False,
        ),
    ] = None,
    sampler_args: Annotated[
        str | None,
        typer.Option(
            "--sampler-args", help="The sampler's keyword arguments as a JSON object, e.g. '{\"n_startup_trials\": 5}'."
        ),
    ] = None,
    pruner: Annotated[
        str | None,
        typer.Option(
            "--pruner",
            help="The study's pruner: a class of optuna.pruners (MedianPruner, HyperbandPruner, ...), a dotted "
            "path, path/to/file.py:ClassOrFunction, or none. Default: Optuna's (MedianPruner).",
            show_default=False,
        ),
    ] = None,
    pruner_args: Annotated[
        str | None,
        typer.Option(
            "--pruner-args", help="The pruner's keyword arguments as a JSON object, e.g. '{\"n_warmup_steps\": 10}'."
        ),
    ] = None,
    seed: Annotated[
        int | None, typer.Option("--seed", help="The sampler's seed (its seed argument; TPE's when no --sampler).")
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
    pool_option: PoolOption = None,
    deadline: DeadlineOption = None,
    budget: BudgetOption = None,
    price_per_device_hour: PriceOption = 0.0,
    allow_shared_cores: SharedCoresOption = False,
) -> None:
    """Run a sweep: add --n-trials trials to the study, each planned and launched on the device pool."""
    the_sampler, the_pruner = make_sampler(sampler, sampler_args, seed), make_pruner(pruner, pruner_args)
    if not _is_progress_mode(progress):
        fail(f"--progress must be one of {', '.join(PROGRESS_MODES)}, got {progress!r}.")
    if not _is_direction(direction):
        fail(f"--direction must be minimize or maximize, got {direction!r}.")
    mode: ProgressMode = "quiet" if quiet else progress
    check_storage_url(storage)
    check_sweep_options(
        devices=parse_devices(devices),
        strategies=split(strategies) if strategies else None,
        folders=strategy_folder or [],
        allow_shared_cores=allow_shared_cores,
        runner=runner,
        solver=solver,
        deadline=deadline,
        budget=budget,
        price_per_device_hour=price_per_device_hour,
    )
    function = load_objective(objective)
    view = make_progress(mode)
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
            **pool_arguments(runner, ray_address, pool_option or ()),
            deadline=deadline,
            budget=budget,
            price_per_device_hour=price_per_device_hour,
            allow_shared_cores=allow_shared_cores,
        )
    except (ValueError, TypeError, ImportError, ConnectionError, RuntimeError, TimeoutError) as exc:
        fail(str(exc))
    verbosity = optuna.logging.get_verbosity()
    if not isinstance(view, RichProgress):  # plain or quiet: our lines replace Optuna's per-trial INFO lines
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    known: int | None = None  # the study's trials before this sweep (None: not opened yet)
    try:
        the_study = optuna.create_study(
            storage=open_storage(storage),
            study_name=study,
            direction=direction,
            load_if_exists=True,
            sampler=the_sampler,
            pruner=the_pruner,
        )
        if n_trials is None and timeout is None and mode != "quiet":
            typer.echo("No --n-trials or --timeout: trials are added until Ctrl-C or study.stop().", err=True)
        known = len(the_study.get_trials(deepcopy=False))
        executor.optimize(the_study, function, n_trials=n_trials, timeout=timeout, batch_size=batch_size)
    except DeadlineUnreachable as exc:
        fail(f"Refused: {exc}")
    except KeyboardInterrupt:
        ran = known is not None and len(the_study.get_trials(deepcopy=False)) > known
        typer.echo(
            "Interrupted: running trials were stopped and recorded as FAIL."
            if ran
            else "Interrupted before any trial started (the sweep was still waiting for its devices): nothing ran.",
            err=True,
        )
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
                f"--dashboard needs optuna-dashboard and plotly ({exc}): pip install optuna-dashboard plotly "
                "kaleido (the dashboard extra), or pass --no-dashboard."
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


@app.command(
    epilog=examples(
        "optuna-saturn profile train.py:objective --n-trials 4 --devices 2",
        "optuna-saturn profile train.py:objective --strategies single,ddp,zero2",
    )
)
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
    allow_shared_cores: SharedCoresOption = False,
) -> None:
    """Profile only: measure sampled configurations under every feasible strategy and device count, fill the
    profile store, and print the table. Runs no trial and writes nothing to any study."""
    check_sweep_options(
        devices=parse_devices(devices),
        strategies=split(strategies) if strategies else None,
        folders=strategy_folder or [],
        allow_shared_cores=allow_shared_cores,
        runner="local",
        solver="auto",
        deadline=None,
        budget=None,
        price_per_device_hour=0.0,
    )
    function = load_objective(objective)
    try:
        executor = _executor(
            devices,
            strategies,
            strategy_folder,
            isolate_network,
            log_dir,
            profile_store=profile_store,
            allow_shared_cores=allow_shared_cores,
        )
    except (ValueError, TypeError) as exc:
        fail(str(exc))
    try:
        measured = executor.profile(function, n_trials, seed=seed)
    except KeyboardInterrupt:
        raise typer.Exit(INTERRUPTED) from None
    if not any(record(t, "profiles") for t in measured.trials):
        fail(
            "Nothing could be profiled: the objective must build its model and data loader, call "
            "trial.prepare(model, optimizer, loader), then loop over trial.steps(n)."
        )
    from rich.console import Console

    from optuna_saturn.cli.profile_table import profile_table

    Console().print(profile_table(measured.trials, title=f"Profiles in {profile_store}"))


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


def parse_devices(text: str) -> Any:
    """``"4"`` -> 4; ``"0,1"`` -> [0, 1]; ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cpu:8"`` stay strings."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    if "," in text:
        return ints(text, "--devices")
    return text


def _is_progress_mode(value: str) -> TypeGuard[ProgressMode]:
    return value in PROGRESS_MODES


def _is_direction(value: str) -> TypeGuard[Literal["minimize", "maximize"]]:
    return value in ("minimize", "maximize")
