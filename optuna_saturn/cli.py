"""The ``optuna-saturn`` command line: run a sweep, re-plan or simulate a recorded one, and report on it.

Why a command line as well as the Python API: a sweep of hours is started from a shell and inspected from
another one, often on a machine without a notebook. Every command works on an Optuna storage URL and a study
name, like ``optuna-dashboard`` and Optuna's own CLI. Mistakes in the input (an objective that cannot be found, a
storage URL that does not parse, more devices than the machine has, an unknown strategy, a study that does not
exist) end with a message that names the fix and exit code 2.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import optuna
import typer

from optuna_saturn.progress import PROGRESS_MODES, RichProgress, make_progress

USAGE_ERROR = 2
INTERRUPTED = 130

app = typer.Typer(
    name="optuna-saturn",
    help="Run Optuna sweeps of large models on a pool of devices, choosing each trial's parallelism strategy, "
    "device count and start jointly; then see, re-plan and simulate them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain (Click) help: rich's option tables squeeze every description into a narrow column on an 80-column
    # terminal; Click's layout wraps them under a short option column.
    rich_markup_mode=None,
)

StorageOption = Annotated[str, typer.Option(
    "--storage", envvar="OPTUNA_SATURN_STORAGE", show_envvar=True,
    help="Optuna storage URL, e.g. sqlite:///sweep.sqlite3 or postgresql://user@host/db.",
)]
StudyOption = Annotated[str | None, typer.Option(
    "--study", help="Study name. May be left out when the storage holds exactly one study.",
)]
SolverOption = Annotated[str, typer.Option(
    "--solver", help="Planner backend: auto, gurobi, highs, cpsat, list, greedy, sequential-max, task-parallel.",
)]
DevicesOption = Annotated[str, typer.Option(
    "--devices", help="'auto' (every GPU, else one CPU device per core), 'cpu', 'cuda', a number, or "
    "comma-separated CUDA indices such as 0,1,3.")]
StrategiesOption = Annotated[str | None, typer.Option(
    "--strategies", help="Comma-separated strategy names, e.g. single,ddp (default: every known one).",
    show_default=False)]
StrategyFolderOption = Annotated[list[Path] | None, typer.Option(
    "--strategy-folder", help="A folder of extra strategy templates (TOML); may be repeated.")]
IsolateOption = Annotated[bool, typer.Option(
    "--isolate-network", help="Run each trial in its own loopback-only network namespace (Linux; root or "
    "user namespaces). Launchers listen on every interface; use this on shared hosts.")]
RunnerOption = Annotated[str, typer.Option(
    "--runner", help="local: this machine's devices. ray: the alive nodes of a Ray cluster (each trial inside one "
    "node; --devices is then read per node).")]
RayAddressOption = Annotated[str | None, typer.Option(
    "--ray-address", envvar="RAY_ADDRESS", show_envvar=True,
    help="With --runner ray: the cluster's address, HEAD_IP:6379 (default: the one `ray start` runs here).")]
LogDirOption = Annotated[Path, typer.Option("--log-dir", help="Where each trial's log is written.")]
ProfileStoreOption = Annotated[Path, typer.Option(
    "--profile-store", help="Folder of cached profiles, keyed by what affects speed (model shape, batch, "
    "strategy, device count, hardware).")]
RuntimesOption = Annotated[str, typer.Option(
    "--runtimes",
    help="'observed': each trial's options rescaled by its actual / planned runtime (what really happened); "
    "'estimated': the estimates the sweep planned with.",
)]


def fail(message: str) -> NoReturn:
    """Bad input: print ``Error: <message>`` (which names the fix) and exit with code 2, like click's usage errors."""
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(USAGE_ERROR)


# --------------------------------------------------------------------------------------------------------------------
# run
# --------------------------------------------------------------------------------------------------------------------
@app.command()
def run(
    objective: Annotated[str, typer.Argument(
        help="The objective: path/to/file.py:function or package.module:function. Its file is imported, not run, "
        "so keep sweep-starting code under `if __name__ == \"__main__\":`.",
        show_default=False,
    )],
    storage: StorageOption,
    study: Annotated[str, typer.Option("--study", help="Study name; created when missing, continued otherwise.")]
    = "saturn",
    n_trials: Annotated[int | None, typer.Option(
        "--n-trials", min=0, help="Trials to add (counts new trials, like study.optimize).")] = None,
    devices: DevicesOption = "auto",
    strategies: StrategiesOption = None,
    strategy_folder: StrategyFolderOption = None,
    timeout: Annotated[float | None, typer.Option(
        "--timeout", min=0.001, help="Stop asking for new trials after this many seconds.")] = None,
    batch_size: Annotated[int | None, typer.Option(
        "--batch-size", min=1,
        help="Look-ahead: how many asked trials may wait for devices (default: the number of devices).")] = None,
    solver: SolverOption = "auto",
    direction: Annotated[str, typer.Option(
        "--direction", help="minimize or maximize; used when the study is created.")] = "minimize",
    isolate_network: IsolateOption = False,
    log_dir: LogDirOption = Path("saturn-runs"),
    profile: Annotated[bool, typer.Option(
        "--profile/--no-profile", help="Measure each trial's options with short real runs before planning.")]
    = True,
    profile_store: ProfileStoreOption = Path("profiles"),
    profile_budget: Annotated[float | None, typer.Option(
        "--profile-budget", min=0.001, help="Seconds of profiling allowed per batch; the rest is estimated.")]
    = None,
    progress: Annotated[str, typer.Option(
        "--progress", help="Live progress: auto (a table on a terminal, log lines otherwise), rich, plain, quiet.",
    )] = "auto",
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="No progress display and only warnings in the log (same as --progress quiet).")]
    = False,
    dashboard: Annotated[bool | None, typer.Option(
        "--dashboard/--no-dashboard", help="Keep a schedule chart and a plan note on the study for "
        "optuna-dashboard, updated as the sweep runs. Default: on when optuna-dashboard is installed.",
        show_default=False)] = None,
    elastic: Annotated[bool, typer.Option(
        "--elastic/--no-elastic", help="Move a running trial that checkpoints to another strategy or device count "
        "when the sweep then ends sooner (elastic resize).")] = True,
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
            devices, strategies, strategy_folder, isolate_network, log_dir, solver=solver, listeners=listeners,
            profile=profile, profile_store=profile_store, profile_budget=profile_budget, elastic=elastic,
            runner=runner, ray_address=ray_address if runner == "ray" else None,
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
            fail(f"--dashboard needs optuna-dashboard and plotly ({exc}): pip install 'optuna-saturn[dashboard]', "
                 "or pass --no-dashboard.")
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
    typer.echo(f"See the sweep:  optuna-dashboard {storage}    or    optuna-saturn report --storage {storage} "
               f"--study {study.study_name}")


# --------------------------------------------------------------------------------------------------------------------
# plan
# --------------------------------------------------------------------------------------------------------------------
@app.command()
def plan(
    storage: StorageOption,
    study: StudyOption = None,
    devices: Annotated[int | None, typer.Option(
        "--devices", min=1, help="Plan on one node with this many devices (default: the recorded sweep's pool).",
        show_default=False)] = None,
    nodes: Annotated[str | None, typer.Option(
        "--nodes", help="Plan on several nodes, devices per node, e.g. 8,8.", show_default=False)] = None,
    solver: SolverOption = "auto",
    time_limit: Annotated[float, typer.Option("--time-limit", min=0.0, help="Seconds the planner may use.")] = 10.0,
    runtimes: RuntimesOption = "observed",
) -> None:
    """Re-plan a study's trials as one batch from the options they recorded, and print the plan."""
    from rich.table import Table

    from optuna_saturn.planner import lower_bound, solve

    the_study = open_study(storage, study)
    jobs, cluster = _jobs_and_cluster(the_study, runtimes, _one_cluster(devices, nodes))
    try:
        result = solve(jobs, cluster, solver=solver, time_limit=time_limit)
    except ValueError as exc:  # unknown solver, options that fit no node
        fail(str(exc))
    table = Table(title=f"Plan for {len(jobs)} trial(s) of {the_study.study_name!r} on nodes "
                  f"{list(cluster.nodes)} ({runtimes} runtimes, solver {result.solver})", title_justify="left")
    for column in ("trial", "strategy", "devices", "micro-batches", "node", "device ids", "start (s)", "end (s)"):
        table.add_column(column, justify="left" if column in ("strategy", "device ids") else "right")
    for a in sorted(result.assignments, key=lambda a: (a.start, a.node, a.devices)):
        table.add_row(a.job, a.option.strategy, str(a.option.devices), str(a.option.gradient_accumulation), str(a.node),
                      ",".join(map(str, a.devices)), f"{a.start:.1f}", f"{a.end:.1f}")
    _console().print(table)
    bound = lower_bound(jobs, cluster)
    typer.echo(f"makespan {result.makespan:.1f} s, lower bound {bound:.1f} s "
               f"({_gap(result.makespan, bound)} over the bound{', optimal' if result.optimal else ''})")


# --------------------------------------------------------------------------------------------------------------------
# simulate
# --------------------------------------------------------------------------------------------------------------------
@app.command()
def simulate(
    storage: StorageOption,
    study: StudyOption = None,
    devices: Annotated[str | None, typer.Option(
        "--devices", help="Device counts to compare, comma-separated, e.g. 2,4,8 (each one node).",
        show_default=False)] = None,
    nodes: Annotated[list[str] | None, typer.Option(
        "--nodes", help="A cluster as devices per node, e.g. 8,8; may be repeated to compare clusters.",
        show_default=False)] = None,
    solver: SolverOption = "auto",
    time_limit: Annotated[float, typer.Option(
        "--time-limit", min=0.0, help="Seconds the planner may use per cluster.")] = 2.0,
    runtimes: RuntimesOption = "observed",
) -> None:
    """What if: how long would this study's trials take on other device counts or clusters."""
    from rich.table import Table

    from optuna_saturn.planner import Cluster, lower_bound, solve
    from optuna_saturn.report import read_study

    the_study = open_study(storage, study)
    clusters = [Cluster([n]) for n in _ints(devices, "--devices")] if devices else []
    clusters += [Cluster(_ints(spec, "--nodes")) for spec in nodes or ()]
    jobs, default = _jobs_and_cluster(the_study, runtimes, clusters[0] if clusters else None)
    sweeps = read_study(the_study)
    actual = sum(s.makespan for s in sweeps) or None
    table = Table(title=f"{len(jobs)} trial(s) of {the_study.study_name!r}, planned as one batch "
                  f"({runtimes} runtimes)", title_justify="left")
    for column in ("nodes", "devices", "makespan (s)", "lower bound (s)", "gap", "vs recorded sweep"):
        table.add_column(column, justify="right")
    for cluster in clusters or [default]:
        try:
            result = solve(jobs, cluster, solver=solver, time_limit=time_limit)
        except ValueError as exc:
            fail(f"On nodes {list(cluster.nodes)}: {exc}")
        bound = lower_bound(jobs, cluster)
        versus = _speedup(actual, result.makespan)
        table.add_row(",".join(map(str, cluster.nodes)), str(cluster.total_devices), f"{result.makespan:.1f}",
                      f"{bound:.1f}", _gap(result.makespan, bound), versus)
    _console().print(table)
    if actual:
        typer.echo(f"The recorded sweep(s) took {actual:.1f} s in all (planned batch by batch).")


# --------------------------------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------------------------------
@app.command()
def report(
    storage: StorageOption,
    study: StudyOption = None,
    out: Annotated[Path, typer.Option("--out", help="Folder for schedule.html, schedule.png and summary.txt.")]
    = Path("saturn-report"),
    png: Annotated[bool, typer.Option("--png/--no-png", help="Also write the chart as PNG (kaleido or Chromium).")]
    = True,
    publish: Annotated[bool, typer.Option(
        "--publish", help="Also save the chart and a plan note to the study, for optuna-dashboard.")] = False,
    last_sweep: Annotated[bool, typer.Option(
        "--last-sweep", help="Only the latest sweep (one `run`/optimize call) of the study.")] = False,
) -> None:
    """Write the schedule chart (HTML, PNG) and a text summary of a study's sweeps."""
    from optuna_saturn.report import ExportError, format_summary, read_study, schedule_figure, write_html, write_png

    the_study = open_study(storage, study)
    sweeps = read_study(the_study)
    if last_sweep:
        sweeps = sweeps[-1:]
    states: dict[str, int] = {}
    for trial in the_study.get_trials(deepcopy=False):
        states[trial.state.name] = states.get(trial.state.name, 0) + 1
    text = (f"Study {the_study.study_name!r}: {sum(states.values())} trial(s): "
            + (", ".join(f"{k} {v}" for k, v in sorted(states.items())) or "none") + "\n\n" + format_summary(sweeps))
    typer.echo(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.txt").write_text(text + "\n", encoding="utf-8")
    figure = schedule_figure(sweeps)
    written = [write_html(figure, out / "schedule.html"), out / "summary.txt"]
    if png:
        try:
            how = write_png(figure, out / "schedule.png")
        except ExportError as exc:
            typer.echo(f"Error: {exc} Or pass --no-png.", err=True)
            raise typer.Exit(1) from None
        written.append(out / "schedule.png")
        typer.echo(f"(PNG written with {how})")
    if publish:
        from optuna_saturn.report import publish as publish_to_study

        try:
            publish_to_study(the_study, sweeps)
        except ImportError as exc:
            fail(str(exc))
        typer.echo(f"Published the chart and note to the study: optuna-dashboard {storage}")
    typer.echo("Wrote " + ", ".join(str(p) for p in written))


# --------------------------------------------------------------------------------------------------------------------
# profile
# --------------------------------------------------------------------------------------------------------------------
@app.command()
def profile(
    objective: Annotated[str, typer.Argument(
        help="The objective, as for `run`. It must use trial.prepare(...) and trial.steps(n).", show_default=False,
    )],
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
        executor = _executor(devices, strategies, strategy_folder, isolate_network, log_dir,
                             profile_store=profile_store, progress=None)
    except (ValueError, TypeError) as exc:
        fail(str(exc))
    try:
        measured = executor.profile(function, n_trials, seed=seed)
    except KeyboardInterrupt:
        raise typer.Exit(INTERRUPTED) from None
    if not any(t.user_attrs.get("saturn:profiles") for t in measured.trials):
        fail("Nothing could be profiled: the objective must build its model and data loader, call "
             "trial.prepare(model, optimizer, loader), then loop over trial.steps(n).")
    from rich.table import Table

    table = Table(title=f"Profiles in {profile_store}")
    columns = ("trial", "params", "strategy", "devices", "micro-batches", "ms/step", "start-up s", "peak MiB", "fits",
               "trial s")
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
                str(trial.number), ", ".join(f"{k}={_short(v)}" for k, v in trial.params.items()), p["strategy"],
                str(p["devices"]), str(accumulation), f"{p['step_seconds'] * 1e3:.1f}" if ok else "-",
                f"{p['startup_seconds']:.1f}" if ok else "-",
                f"{p['peak_memory_bytes'] / 2**20:.0f}" if ok else "-", "yes" if ok else "no",
                f"{runtimes[(p['strategy'], p['devices'], accumulation)]:.1f}" if ok else "-",
            )
    _console().print(table)


# --------------------------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------------------------
def _executor(
    devices: str, strategies: str | None, strategy_folder: list[Path] | None, isolate_network: bool, log_dir: Path,
    **options: Any,
) -> Any:
    """The executor for the options `run` and `profile` share; progress and the dashboard are the CLI's own."""
    from optuna_saturn import SaturnExecutor

    options.setdefault("progress", None)
    return SaturnExecutor(
        devices=parse_devices(devices), strategies=_split(strategies) if strategies else None,
        strategy_folders=strategy_folder or (), isolate_network=isolate_network, log_dir=log_dir,
        dashboard=False, **options,
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
            fail(f"Objective file {path.name!r} cannot be imported by workers: rename it to a valid Python module "
                 "name (letters, digits, underscores).")
        sys.path.insert(0, str(path.parent))
        module = _import(module_name, spec)
        loaded_from = Path(getattr(module, "__file__", "") or "").resolve()
        if loaded_from != path:
            fail(f"The module name {module_name!r} of {str(path)!r} is taken by {str(loaded_from)!r}; rename "
                 "your file so that workers import the right one.")
    else:
        if os.getcwd() not in sys.path:  # like `python -m`: modules in the current folder are found
            sys.path.insert(0, os.getcwd())
        module = _import(target, spec)
    function = module
    for part in name.split("."):
        function = getattr(function, part, None)
        if function is None:
            found = sorted(k for k, v in vars(module).items() if callable(v) and getattr(v, "__module__", "")
                           == module.__name__ and not k.startswith("_"))
            fail(f"No function {name!r} in {target!r}. Functions defined there: {', '.join(found) or 'none'}.")
    if not callable(function):
        fail(f"{spec!r} is not a function but a {type(function).__name__}.")
    return function  # type: ignore[return-value]


def _import(module_name: str, spec: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            fail(f"Cannot import module {module_name!r} for {spec!r}: run from the folder that contains it, put it on "
                 "PYTHONPATH, or give the objective as path/to/file.py:function.")
        raise


def parse_devices(text: str) -> Any:
    """``"4"`` -> 4; ``"0,1"`` -> [0, 1]; ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cpu:8"`` stay strings."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    if "," in text:
        return _ints(text, "--devices")
    return text


def open_storage(url: str, *, must_exist: bool = False) -> optuna.storages.BaseStorage:
    """An Optuna storage for ``url``, or an error that shows what a URL looks like."""
    import sqlalchemy.exc

    example = "sqlite:///sweep.sqlite3 (a file in this folder) or postgresql://user:password@host/database"
    if "://" not in url:
        fail(f"Malformed storage URL {url!r}: use a database URL such as {example}.")
    if must_exist and url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if path and path != ":memory:" and not os.path.exists(path):
            fail(f"No database file at {path!r} (from --storage {url!r}). Check the path; run a sweep with "
                 "`optuna-saturn run` to create one.")
    try:
        return optuna.storages.get_storage(url)
    except sqlalchemy.exc.ArgumentError:
        fail(f"Malformed storage URL {url!r}: use a database URL such as {example}.")
    except sqlalchemy.exc.SQLAlchemyError as exc:
        fail(f"Cannot open storage {url!r}: {str(exc).splitlines()[0]}. Check the path or server, e.g. {example}.")
    except ImportError as exc:
        fail(f"Cannot open storage {url!r}: {exc} (e.g. pip install psycopg2-binary for PostgreSQL).")


def open_study(url: str, name: str | None) -> optuna.Study:
    """Load an existing study; without a name, the storage's only study."""
    storage = open_storage(url, must_exist=True)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
    if name is None:
        if len(names) != 1:
            fail(f"The storage holds {len(names)} studies; pick one with --study: {', '.join(names) or 'none'}.")
        name = names[0]
    if name not in names:
        fail(f"Study {name!r} does not exist in {url!r}. Studies there: {', '.join(names) or 'none'}. "
             "Check --study, or create it with `optuna-saturn run ... --study NAME`.")
    return optuna.load_study(study_name=name, storage=storage)


def _jobs_and_cluster(study: optuna.Study, runtimes: str, cluster: Any) -> tuple[list, Any]:
    from optuna_saturn.planner import Cluster
    from optuna_saturn.report import jobs_from_runs, read_study
    from optuna_saturn.report.schedule import run_from_trial

    if runtimes not in ("observed", "estimated"):
        fail(f"--runtimes must be observed or estimated, got {runtimes!r}.")
    runs = [run_from_trial(t) for t in study.get_trials(deepcopy=False)]
    jobs = jobs_from_runs(runs, observed=runtimes == "observed")
    if not jobs:
        fail(f"No trial of study {study.study_name!r} recorded planner options (saturn:options); run a sweep "
             "with `optuna-saturn run` or SaturnExecutor first.")
    if cluster is None:
        sweeps = read_study(study)
        pool = sweeps[-1].pool if sweeps else ()
        if not pool:
            fail("Cannot tell how many devices the sweep had; pass --devices N or --nodes 8,8.")
        cluster = Cluster([len(pool)])
    return jobs, cluster


def _one_cluster(devices: int | None, nodes: str | None) -> Any:
    from optuna_saturn.planner import Cluster

    if devices is not None and nodes is not None:
        fail("Give either --devices or --nodes, not both.")
    if nodes is not None:
        return Cluster(_ints(nodes, "--nodes"))
    return Cluster([devices]) if devices is not None else None


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in _split(text)]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        fail(f"{option} takes positive integers separated by commas, e.g. 8,8; got {text!r}.")
    return values


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _gap(makespan: float, bound: float) -> str:
    return f"+{100 * (makespan / bound - 1):.1f}%" if bound > 0 else "-"


def _speedup(recorded: float | None, planned: float) -> str:
    if not recorded or planned <= 0:
        return "-"
    ratio = recorded / planned
    return f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"


def _console() -> Any:
    from rich.console import Console

    return Console(width=max(100, Console().width))


def main() -> None:
    """Entry point of the ``optuna-saturn`` script."""
    app()


if __name__ == "__main__":
    main()
