"""The ``optuna-saturn`` command line's app, its shared options, and what every command needs: a study opened from a
storage URL, bad input turned into a message that names the fix."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn

import optuna
import typer

from optuna_saturn.planner import SOLVERS
from optuna_saturn.study.urls import without_password

USAGE_ERROR = 2
INTERRUPTED = 130

app = typer.Typer(
    name="optuna-saturn",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain (Click) help: rich's option tables squeeze every description into a narrow column on an 80-column
    # terminal; Click's layout wraps them under a short option column.
    rich_markup_mode=None,
)

StorageOption = Annotated[
    str,
    typer.Option(
        "--storage",
        envvar="OPTUNA_SATURN_STORAGE",
        show_envvar=True,
        help="Optuna storage URL, e.g. sqlite:///sweep.sqlite3 or postgresql://user@host/db.",
    ),
]
StudyOption = Annotated[
    str | None,
    typer.Option(
        "--study", "--study-name", help="Study name. May be left out when the storage holds exactly one study."
    ),
]
SolverOption = Annotated[str, typer.Option("--solver", help=f"Planner backend: {', '.join(SOLVERS)}.")]
DevicesOption = Annotated[
    str,
    typer.Option(
        "--devices",
        help="'auto' (every GPU, else one CPU device per core), 'cpu', 'cuda', a number, or "
        "comma-separated CUDA indices such as 0,1,3.",
    ),
]
StrategiesOption = Annotated[
    str | None,
    typer.Option(
        "--strategies",
        help="Comma-separated strategy names, e.g. single,ddp (default: every known one).",
        show_default=False,
    ),
]
StrategyFolderOption = Annotated[
    list[Path] | None,
    typer.Option("--strategy-folder", help="A folder of extra strategy templates (TOML); may be repeated."),
]
IsolateOption = Annotated[
    bool,
    typer.Option(
        "--isolate-network",
        help="Run each trial in its own loopback-only network namespace (Linux; root or "
        "user namespaces). Launchers listen on every interface; use this on shared hosts.",
    ),
]
RunnerOption = Annotated[
    str,
    typer.Option(
        "--runner",
        help="local: this machine's devices. ray: the alive nodes of a Ray cluster (each trial inside one "
        "node; --devices is then read per node).",
    ),
]
RayAddressOption = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        envvar="RAY_ADDRESS",
        show_envvar=True,
        help="With --runner ray: the cluster's address, HEAD_IP:6379 (default: the one `ray start` runs here).",
    ),
]
PoolOption = Annotated[
    list[str] | None,
    typer.Option(
        "--pool-option",
        help="KEY=VALUE: a keyword of the --runner's pool (see docs/clusters.md: nodes=2, partition=gpu, "
        "time=4:00:00 ask a SLURM cluster for nodes); may be repeated.",
    ),
]

SharedCoresOption = Annotated[
    bool,
    typer.Option(
        "--allow-shared-cores",
        help="On CPU, allow more devices than cores (devices then share cores, and their trials slow each other).",
    ),
]
LogDirOption = Annotated[Path, typer.Option("--log-dir", help="Where each trial's log is written.")]
DeadlineOption = Annotated[
    str | None,
    typer.Option(
        "--deadline",
        help="Every trial of the sweep (the queue's, and those --n-trials asks) ends within this long of the start "
        "(seconds, or 90m, 8h, 1h30m), at the fewest device-hours; one no plan meets is refused with the earliest "
        "end.",
    ),
]
BudgetOption = Annotated[
    float | None,
    typer.Option("--budget", min=0.001, help="Device-hours the sweep may spend: the earliest end within them."),
]
PriceOption = Annotated[
    float, typer.Option("--price-per-device-hour", min=0.0, help="What a device-hour costs: plans report the cost.")
]
ProfileStoreOption = Annotated[
    Path,
    typer.Option(
        "--profile-store",
        help="Folder of cached profiles, keyed by what affects speed (model shape, batch, "
        "strategy, device count, hardware).",
    ),
]
RuntimesOption = Annotated[
    str,
    typer.Option(
        "--runtimes",
        help="'observed': each trial's options rescaled by its actual / planned runtime (what really happened); "
        "'estimated': the estimates the sweep planned with.",
    ),
]


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        from optuna_saturn import __version__

        def installed(name: str) -> str:
            try:
                return version(name)
            except PackageNotFoundError:
                return "not installed"

        typer.echo(
            f"optuna-saturn {__version__} (optuna {installed('optuna')}, torch {installed('torch')}, "
            f"deepspeed {installed('deepspeed')}, lightning {installed('lightning')})"
        )
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the versions of optuna-saturn, Optuna, torch, DeepSpeed and Lightning, and exit.",
        ),
    ] = False,
) -> None:
    """Run Optuna sweeps of large models on a pool of devices, choosing each trial's parallelism strategy, device
    count and start jointly; then see, re-plan and simulate them.

    \b
    Start with:
      optuna-saturn run examples/gpt2_sweep.py:objective \\
          --storage sqlite:///sweep.sqlite3 --study gpt2 --n-trials 4
      optuna-saturn COMMAND --help
    """


def examples(*lines: str) -> str:
    """A command's epilog: its examples, kept as written (``\\b`` stops Click from re-wrapping them)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


def fail(message: str) -> NoReturn:
    """Bad input: print ``Error: <message>`` (which names the fix) and exit with code 2, like click's usage errors."""
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(USAGE_ERROR)


def open_storage(url: str, *, must_exist: bool = False) -> optuna.storages.BaseStorage:
    """An Optuna storage for ``url``, or an error that shows what a URL looks like."""
    import sqlalchemy.exc

    from optuna_saturn.study.storage_checks import refuse_lost_guarantees

    example = "sqlite:///sweep.sqlite3 (a file in this folder) or postgresql://user:password@host/database"
    if "://" not in url:
        fail(f"Malformed storage URL {without_password(url)!r}: use a database URL such as {example}.")
    if must_exist and url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
        if path and path != ":memory:" and not os.path.exists(path):
            fail(
                f"No database file at {path!r} (from --storage {without_password(url)!r}). Check the path; "
                "run a sweep with `optuna-saturn run` to create one."
            )
    try:
        try:
            storage = optuna.storages.get_storage(url)
        except sqlalchemy.exc.OperationalError as exc:  # (another sweep made the tables of a new database first)
            if "already exists" not in str(exc):
                raise
            storage = optuna.storages.get_storage(url)
        refuse_lost_guarantees(storage)
        return storage
    except ValueError as exc:
        fail(str(exc))
    except sqlalchemy.exc.ArgumentError:
        fail(f"Malformed storage URL {without_password(url)!r}: use a database URL such as {example}.")
    except sqlalchemy.exc.SQLAlchemyError as exc:
        fail(
            f"Cannot open storage {without_password(url)!r}: {str(exc).splitlines()[0]}. "
            f"Check the path or server, e.g. {example}."
        )
    except ImportError as exc:
        fail(f"Cannot open storage {without_password(url)!r}: {exc} (e.g. pip install psycopg2-binary for PostgreSQL).")


def open_study(url: str, name: str | None) -> optuna.Study:
    """Load an existing study; without a name, the storage's only study."""
    storage = open_storage(url, must_exist=True)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
    if name is None:
        if len(names) != 1:
            fail(f"The storage holds {len(names)} studies; pick one with --study: {', '.join(names) or 'none'}.")
        name = names[0]
    if name not in names:
        fail(
            f"Study {name!r} does not exist in {without_password(url)!r}. Studies there: {', '.join(names) or 'none'}. "
            "Check --study, or create it with `optuna-saturn run ... --study NAME`."
        )
    return optuna.load_study(study_name=name, storage=storage)


def ints(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in split(text)]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        fail(f"{option} takes positive integers separated by commas, e.g. 8,8; got {text!r}.")
    return values


def split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def gap(makespan: float, bound: float) -> str:
    return f"+{100 * (makespan / bound - 1):.1f}%" if bound > 0 else "-"


def console() -> Any:
    from rich.console import Console

    return Console(width=max(100, Console().width))


def main() -> None:
    """Entry point of the ``optuna-saturn`` script (the package's ``__init__`` has added every command)."""
    app()


def pool_arguments(runner: str, ray_address: str | None, options: Sequence[str]) -> dict[str, Any]:
    """The executor's keywords for the pool: ``pool=`` made with the ``--pool-option`` values where there are some,
    else ``runner=`` (and ``ray_address=``, which a Ray pool alone takes)."""
    if not options:
        return {"runner": runner, "ray_address": ray_address if runner == "ray" else None}
    from optuna_saturn.pools.options import pool_from_options  # (here: the pools import torch)

    return {"pool": pool_from_options(runner, options)}
