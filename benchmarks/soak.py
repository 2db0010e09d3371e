"""A soak with every fault at once: ``--trials`` trials of 0.2-2 s on 2 CPU devices, on each storage in turn
(SQLite, PostgreSQL, an Optuna journal), while seeded faults hit the sweep (``benchmarks/soak_run.py``):
``kill -9`` of a worker, of a rank and of the executor (then a new executor process continues the study), a stale
DeepSpeed build lock, a ``--outage`` s storage outage, the disk under ``log_dir`` full for ``--disk`` s, and a
second sweep on the same study at the same time.

At the end (``benchmarks/soak_checks.py``), on each storage: every trial asked is COMPLETE with the right value,
or FAIL with a reason and its run again COMPLETE; nothing is RUNNING; no params ran twice except a FAIL's run again;
no process, thread, descriptor, lease, temporary folder or untold result is left. It prints a table per storage
and exits non-zero if any storage lost, left stuck or ran twice a trial, leaked anything, or missed a fault.

Each fault fires once the study holds a seeded share (10-75%) of the trials ended, so a run can be repeated with
the same ``--seed``. Every launch runs in a loopback-only network namespace (``isolate_network=True``). PostgreSQL:
a server of its own (``tests/postgres.py``: 127.0.0.1 only, stopped by its data folder's PID), or the one
``--postgres FOLDER`` names. Needs root (the
tmpfs of the full disk; PostgreSQL runs as ``postgres`` through ``runuser``), ``unshare`` and ``ip``.

    python benchmarks/soak.py --trials 1000 --storages sqlite,postgres,journal --seed 0
    python benchmarks/soak.py --trials 100 --storages sqlite                      # a shake-out (about 2 min)
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401
import soak_faults
from soak_run import FAULTS, Result, run_soak

TESTS = Path(__file__).resolve().parent.parent / "tests"
STORAGES = ("sqlite", "postgres", "journal")


def _soak_one(kind: str, args: argparse.Namespace, root: Path, server) -> Result:
    work = root / kind
    work.mkdir()
    storage = (
        soak_faults.PostgresStorage(server, f"soak_{args.seed}") if kind == "postgres"
        else soak_faults.FileStorage(kind, work)
    )  # fmt: skip
    return run_soak(
        storage,
        trials=args.trials,
        seed=args.seed,
        work=work,
        faults=set(args.faults),
        seconds=(args.low, args.high),
        outage=args.outage,
        disk=args.disk,
        hang=args.hang,
    )


def given_server(folder: Path):
    """The server ``tests/postgres.py`` started in ``folder`` (its port is in its ``postmaster.pid``)."""
    from postgres import PostgresServer

    pid_file = folder / "data" / "postmaster.pid"
    if not pid_file.exists():
        raise SystemExit(f"no PostgreSQL runs from {folder} ({pid_file} is missing): start one with "
                         f"`python tests/postgres.py start {folder}`, or leave --postgres out")  # fmt: skip
    server = PostgresServer.__new__(PostgresServer)  # (no initdb: it exists)
    server.folder, server.port = str(folder), int(pid_file.read_text().splitlines()[3])
    return server


def table(results: list[Result]) -> str:
    head = (
        "| storage | trials | COMPLETE | FAIL + retried | lost | stuck | duplicates | leaks | faults injected "
        "| sweeps (aborted) | wall (s) |"
    )
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        v = r.verdict
        injected = ", ".join(f"{fault} {r.injected[fault]}" for fault in FAULTS if r.injected[fault])
        if r.missed:
            injected += f"; missed: {', '.join(r.missed)}"
        rows.append(
            f"| {r.storage} | {v.asked} | {v.complete} | {v.failed_and_retried} | {v.lost} | {v.stuck} "
            f"| {v.duplicates} | {v.leaks} | {injected} | {r.sweeps} ({r.aborted}) | {r.wall:.0f} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=1000, help="trials asked on each storage")
    parser.add_argument("--storages", default=",".join(STORAGES), help=f"comma-separated, among {STORAGES}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, among {FAULTS}")
    parser.add_argument("--outage", type=float, default=30.0, help="seconds the storage is unreachable")
    parser.add_argument("--disk", type=float, default=20.0, help="seconds the disk under log_dir is full")
    parser.add_argument("--low", type=float, default=0.2, help="shortest trial (s)")
    parser.add_argument("--high", type=float, default=2.0, help="longest trial (s)")
    parser.add_argument("--hang", type=float, default=600.0, help="seconds without a trial ended that mean stuck")
    parser.add_argument(
        "--postgres",
        metavar="FOLDER",
        help="a server `python tests/postgres.py start FOLDER` started (its outage stops and starts it); default: "
        "one of the soak's own, removed at its end",
    )
    parser.add_argument("--work", default=None, help="folder for the logs (default: a new temporary one)")
    args = parser.parse_args()
    args.faults = [f for f in args.faults.split(",") if f]
    kinds = [k for k in args.storages.split(",") if k]
    wrong = [k for k in kinds if k not in STORAGES] + [f for f in args.faults if f not in FAULTS]
    if wrong or args.trials < 10 or not 0 < args.low <= args.high:
        parser.error(f"{wrong or ''} refused: --storages among {STORAGES}, --faults among {FAULTS}, --trials >= 10, "
                     "0 < --low <= --high")  # fmt: skip
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # (the server and the mounts go on the way out)
    root = Path(args.work or tempfile.mkdtemp(prefix="saturn-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    print(
        f"soak: {args.trials} trials of {args.low:g}-{args.high:g} s on 2 devices, on {', '.join(kinds)}; faults "
        f"{', '.join(args.faults)} (outage {args.outage:g} s, disk full {args.disk:g} s); seed {args.seed}; "
        f"logs: {root}",
        flush=True,
    )
    results: list[Result] = []
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        server = None
        if "postgres" in kinds:
            sys.path.append(str(TESTS))
            from postgres import postgres_server

            server = given_server(Path(args.postgres)) if args.postgres else stack.enter_context(postgres_server())
        for kind in kinds:
            result = _soak_one(kind, args, root, server)
            results.append(result)
            print(f"\n{table([result])}\n", flush=True)
            for problem in result.verdict.problems[:30]:
                print("   ", problem)
    print(f"\nsoak, seed {args.seed}, {time.monotonic() - began:.0f} s in all:\n{table(results)}")
    held = all(r.verdict.held and not r.missed for r in results)
    print("targets (0 lost, 0 stuck, 0 duplicates, 0 leaks, every fault injected):", "PASS" if held else "FAIL")
    sys.exit(0 if held else 1)


if __name__ == "__main__":
    main()
