"""What the command line checks before it imports the objective: every argument that can be judged without the
user's code, torch or a device. A typo in ``--storage``, ``--devices``, ``--strategies`` or ``--deadline`` is then
answered in well under a second (the objective's imports, torch's among them, take seconds), and nothing has been
created: no database file, no study, no trial."""

from __future__ import annotations

from pathlib import Path

from optuna_saturn.cli.app import fail
from optuna_saturn.study.urls import without_password

#: What a storage URL looks like, in every message about one.
STORAGE_EXAMPLE = "sqlite:///sweep.sqlite3 (a file in this folder) or postgresql://user:password@host/database"


def check_storage_url(url: str) -> None:
    """A URL SQLAlchemy can read, with a driver installed for it, and for SQLite a folder that exists; nothing is
    opened or created (that waits for the objective)."""
    import sqlalchemy.exc
    from sqlalchemy.engine import make_url

    shown = without_password(url)
    if "://" not in url:
        fail(f"Malformed storage URL {shown!r}: use a database URL such as {STORAGE_EXAMPLE}.")
    try:
        parsed = make_url(url)
        parsed.get_dialect()
    except sqlalchemy.exc.ArgumentError:
        fail(f"Malformed storage URL {shown!r}: use a database URL such as {STORAGE_EXAMPLE}.")
    except (sqlalchemy.exc.NoSuchModuleError, ImportError) as exc:
        fail(f"Cannot open storage {shown!r}: {exc} (e.g. pip install psycopg2-binary for PostgreSQL).")
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        folder = Path(parsed.database).expanduser().resolve().parent
        if not folder.is_dir():
            fail(f"No folder {str(folder)!r} for the SQLite file of --storage {shown!r}: create it, or fix the path.")


def check_sweep_options(
    *,
    devices: object,
    strategies: list[str] | None,
    folders: list[Path],
    allow_shared_cores: bool,
    runner: str,
    solver: str,
    deadline: str | None,
    budget: float | None,
    price_per_device_hour: float,
) -> None:
    """The executor's options the command line passes, as the executor will judge them (without starting it)."""
    from optuna_saturn.devices import largest_trial, mig_entries, resolve_devices
    from optuna_saturn.nvml import visible_gpu_count
    from optuna_saturn.planner import SOLVERS, goal_of
    from optuna_saturn.pools.registry import kinds
    from optuna_saturn.strategy import select_strategies

    if solver not in SOLVERS:
        fail(f"--solver must be one of {', '.join(SOLVERS)}, got {solver!r}.")
    known = kinds()
    if runner not in known:
        fail(f"--runner must be one of {', '.join(known)}, got {runner!r}.")
    try:
        goal_of(deadline, budget, price_per_device_hour)
        if runner == "local":  # (a Ray cluster's devices are known once it is reached)
            gpus = len(mig_entries()) or visible_gpu_count()
            pool = resolve_devices(devices, allow_shared_cores=allow_shared_cores, n_cuda=gpus)  # type: ignore[arg-type]
            select_strategies(strategies, largest_trial(pool), device_kind=pool[0].kind, folders=list(folders))
    except (ValueError, TypeError) as exc:  # (StrategyError is a ValueError)
        fail(_in_flags(str(exc)))


def _in_flags(message: str) -> str:
    """The executor's message, its fixes named by the command line's flags where it names keywords."""
    for keyword, flag in (("strategy_folders=", "--strategy-folder "), ("strategies=", "--strategies ")):
        message = message.replace(keyword, flag)
    return message
