"""A sweep on PostgreSQL whose server is stopped for ``--outage`` seconds (default 60) at a seeded random moment,
round after round (issue 38's target: over 20 rounds, 0 sweeps aborted, 0 results lost, 0 trials left RUNNING).

Each round: a fresh database on one PostgreSQL server (``tests/postgres.py``: 127.0.0.1 only, run as the
``postgres`` user), and a sweep of ``--trials`` trials (default 4) on 2 CPU devices in a child process of its own
(``SaturnExecutor(devices=2, strategies=["single"], progress=None, dashboard=False, allow_shared_cores=True)``),
so that an abort shows as a non-zero exit and a traceback in its log. Each trial runs ``--steps`` steps of
``--step-sleep`` seconds (default 250 x 0.1 s = 25 s), reports every step and returns a value known from its
parameter, so every report and the result can be checked. Once the first report is in the study, the server is
stopped (``pg_ctl stop -m fast``) ``uniform(0, span)`` seconds later (seeded; ``span`` is the sweep's expected rest:
``ceil(trials / 2)`` trial lengths), and started again ``--outage`` seconds after that. The sweep's storage calls
are retried for 120 s (``optuna_saturn.study.outbox.RETRY_SECONDS``), longer than the outage.

Each report waits for the storage's answer, so an outage holds every running trial at its next report: no trial
ends while the server is down. With ``--report-every K`` (K > ``--steps``: the first step's report only) the
trials run on through the outage, and those that end during it have their results told while the server is down
(the outbox's path).

The sweep looks for dead sweeps' trials every ``--recover`` seconds (default 5; the product's is 30,
``optuna_saturn.study.ownership.RECOVER_SECONDS``, lowered here through ``loop.RECOVER_SECONDS``) so that every
outage overlaps several recovery rounds, each of which must ride the outage out.

After the sweep exits, per round:

- aborted: it exited non-zero, or its log says "Stopping the sweep", or it had not ended ``--hang`` seconds after
  the server came back (then it is stopped with SIGTERM);
- lost: of the ``--trials`` trials asked, how many did not end COMPLETE with every report and the right value
  (a trial run again after a FAIL that then completes counts as kept; the FAIL is counted apart);
- RUNNING: trials left RUNNING (or WAITING);
- outbox: result files left in the sweep's outbox folder (results the storage never got).

Where a round aborted, lost results or left trials RUNNING, a second sweep is run on the same study and log folder
with ``n_trials=0`` (what a user would do), and the same figures are taken again: whether the outbox brought the
results back. The log lines that say why (the storage calls that failed, the traceback) are printed for such
rounds, and the storage calls retried during the outages are summed up for all rounds. Needs root (the server
runs as ``postgres`` through ``runuser``) and PostgreSQL's server (``initdb``, ``pg_ctl``).

    python benchmarks/storage_outage.py --rounds 2 --outage 20        # a check that it works (about 4 min)
    python benchmarks/storage_outage.py [--rounds 20 --outage 60 --seed 0]   # issue 38 (about 35-40 min)
    python benchmarks/storage_outage.py --rounds 3 --report-every 1000     # results told while it is down
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import _common  # noqa: F401

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TESTS = os.path.join(ROOT, "tests")
if TESTS not in sys.path:
    sys.path.append(TESTS)

STUDY = "outage"
DEVICES = 2
_STEPS_ENV, _SLEEP_ENV, _EVERY_ENV = "SATURN_OUTAGE_STEPS", "SATURN_OUTAGE_STEP_SLEEP", "SATURN_OUTAGE_REPORT_EVERY"


# -- the sweep (a child process: ``--sweep``) -------------------------------------------------------------------------
def expected(x: float, step: int) -> float:
    """What the objective reports at ``step`` for parameter ``x`` (its result: the last step's)."""
    return (x - 0.5) ** 2 + 1.0 / (step + 1)


def reported_steps(steps: int, every: int) -> list[int]:
    """The steps the objective reports: the first (the round's clock starts at the first report) and every
    ``every``-th."""
    return [s for s in range(steps) if s == 0 or (s + 1) % every == 0]


def objective(trial) -> float:
    """``--steps`` steps of ``--step-sleep`` seconds, a report every ``--report-every`` steps (and at the first), a
    result known from ``x``."""
    x = trial.suggest_float("x", 0.0, 1.0)
    steps, every = int(os.environ.get(_STEPS_ENV, "250")), int(os.environ.get(_EVERY_ENV, "1"))
    reported = set(reported_steps(steps, every))
    value = 0.0
    for step in trial.steps(steps):
        time.sleep(float(os.environ.get(_SLEEP_ENV, "0.1")))
        value = expected(x, step)
        if step in reported:
            trial.report(value, step)
    return value


def sweep(storage: str, log_dir: str, n_trials: int, recover: float) -> None:
    import optuna

    from optuna_saturn import SaturnExecutor
    from optuna_saturn.study import ownership
    from optuna_saturn.sweep import loop

    loop.RECOVER_SECONDS = recover  # (loop imported the name: this is the one its rounds read)
    ownership.RECOVER_SECONDS = recover  # (the one its warning names)
    optuna.logging.set_verbosity(optuna.logging.INFO)
    print(f"sweep pid {os.getpid()}: {n_trials} trials, recovery every {recover:g} s", flush=True)
    study = optuna.load_study(study_name=STUDY, storage=storage)
    SaturnExecutor(
        devices=DEVICES,
        strategies=["single"],
        progress=None,
        dashboard=False,
        allow_shared_cores=True,
        log_dir=log_dir,
        profile_store=os.path.join(os.path.dirname(log_dir), "profiles"),
    ).optimize(study, objective, n_trials=n_trials)
    print("sweep ended", flush=True)


# -- the rounds -------------------------------------------------------------------------------------------------------
@dataclass
class Figures:
    """What the study holds after a sweep."""

    complete_ok: int = 0
    lost: int = 0
    running: int = 0
    fail: int = 0
    bad_complete: int = 0  # COMPLETE with a report missing or a wrong value
    outbox_left: int = 0
    late: int = 0
    fail_reasons: list[str] = field(default_factory=list)


@dataclass
class Round:
    number: int
    delay: float
    landed: str = "-"
    downtime: float = 0.0
    exit_code: int | None = None
    aborted: bool = False
    hung: bool = False
    wall: float = 0.0
    first: Figures = field(default_factory=Figures)
    second: Figures | None = None
    second_exit: int | None = None
    outbox_told: int = 0
    log: str = ""
    second_log: str = ""

    @property
    def held(self) -> bool:
        return not self.aborted and self.first.lost == 0 and self.first.running == 0


def _child(storage: str, log_dir: str, n_trials: int, args: argparse.Namespace, log_path: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([ROOT, HERE, TESTS, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        _STEPS_ENV: str(args.steps),
        _SLEEP_ENV: str(args.step_sleep),
        _EVERY_ENV: str(args.report_every),
    }
    log = open(log_path, "ab")  # noqa: SIM115 (the child writes it)
    try:
        return subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--sweep", storage, log_dir, str(n_trials), str(args.recover)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # (its own process group: stopped as one if it hangs)
        )
    finally:
        log.close()


def _stop_child(child: subprocess.Popen) -> None:
    """SIGTERM to the sweep's process group (the sweep stops its trials as on Ctrl-C), SIGKILL a minute later."""
    for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
        if child.poll() is not None:
            return
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=wait)


def _trials(storage_url: str):
    """The study's trials, read through a storage of this call's own (its connections closed after)."""
    import optuna

    storage = optuna.storages.RDBStorage(storage_url)
    try:
        study_id = storage.get_study_id_from_name(STUDY)
        return storage.get_all_trials(study_id, deepcopy=False), storage.get_study_user_attrs(study_id)
    finally:
        storage.engine.dispose()


def _figures(storage_url: str, n_trials: int, log_dir: str, steps: int, reported: list[int]) -> Figures:
    from optuna.trial import TrialState

    trials, study_attrs = _trials(storage_url)
    f = Figures()
    for t in trials:
        if t.state == TrialState.COMPLETE:
            x = t.params.get("x")
            reports = t.intermediate_values
            whole = (
                x is not None
                and sorted(reports) == reported
                and all(math.isclose(v, expected(x, s), rel_tol=1e-9) for s, v in reports.items())
                and t.value is not None
                and math.isclose(t.value, expected(x, steps - 1), rel_tol=1e-9)
            )
            f.complete_ok += whole
            f.bad_complete += not whole
        elif t.state in (TrialState.RUNNING, TrialState.WAITING):
            f.running += 1
        elif t.state == TrialState.FAIL:
            f.fail += 1
            f.fail_reasons.append(f"trial {t.number}: {t.system_attrs.get('saturn:fail_reason', '?')}")
    f.lost = max(0, n_trials - f.complete_ok)
    f.outbox_left = len(list(Path(log_dir, "outbox").glob("*/trial-*.json")))
    f.late = sum(k.startswith("saturn:late_result:") for k in study_attrs)
    return f


def _wait_for_first_report(storage_url: str, child: subprocess.Popen, limit: float) -> bool:
    import optuna

    storage = optuna.storages.RDBStorage(storage_url)
    try:
        study_id = storage.get_study_id_from_name(STUDY)
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and child.poll() is None:
            if any(t.intermediate_values for t in storage.get_all_trials(study_id, deepcopy=False)):
                return True
            time.sleep(0.2)
        return False
    finally:
        storage.engine.dispose()


def _landed(storage_url: str, n_trials: int) -> str:
    """Where the sweep stands as the server stops: how many trials ended, how many run (and report)."""
    from optuna.trial import TrialState

    trials, _ = _trials(storage_url)
    done = sum(t.state.is_finished() for t in trials)
    running = [t for t in trials if t.state == TrialState.RUNNING]
    reporting = sum(bool(t.intermediate_values) for t in running)
    if done >= n_trials and not running:
        return f"after the last result ({done} ended)"
    return f"{done} ended, {reporting} reporting" + (
        f", {len(running) - reporting} starting" if len(running) > reporting else ""
    )


def run_round(server, number: int, delay: float, args: argparse.Namespace, work: str) -> Round:
    import optuna

    r = Round(number, delay)
    folder = os.path.join(work, f"round-{number:02d}")
    os.makedirs(folder)
    log_dir, r.log = os.path.join(folder, "runs"), os.path.join(folder, "sweep.log")
    url = server.create_database(f"outage_{number:02d}")
    storage = optuna.storages.RDBStorage(url)
    optuna.create_study(study_name=STUDY, storage=storage)
    storage.engine.dispose()
    began = time.monotonic()
    child = _child(url, log_dir, args.trials, args, r.log)
    try:
        if not _wait_for_first_report(url, child, limit=300):
            r.landed = "no report came"
        else:
            stop_at = time.monotonic() + delay
            while time.monotonic() < stop_at and child.poll() is None:
                time.sleep(0.05)
            if child.poll() is not None:
                r.landed = "after the sweep ended (missed)"
            else:
                r.landed = _landed(url, args.trials)
                port = server.port
                server.stop()
                stopped = time.monotonic()
                time.sleep(args.outage)
                server.start()
                r.downtime = time.monotonic() - stopped
                if server.port != port:  # (tests/postgres.py takes another port if its own was taken meanwhile)
                    raise RuntimeError(f"the server came back on port {server.port}, not {port}: the round is void")
        try:
            r.exit_code = child.wait(timeout=args.hang)
        except subprocess.TimeoutExpired:
            r.hung = True
            _stop_child(child)
            r.exit_code = child.returncode
    finally:
        _stop_child(child)
    r.wall = time.monotonic() - began
    text = Path(r.log).read_text(errors="replace")
    r.aborted = r.hung or r.exit_code != 0 or "Stopping the sweep" in text
    r.first = _figures(url, args.trials, log_dir, args.steps, reported_steps(args.steps, args.report_every))
    if not r.held:  # what a user would do: optimize again on the same study, from the same folder
        r.second_log = os.path.join(folder, "second.log")
        again = _child(url, log_dir, 0, args, r.second_log)
        try:
            r.second_exit = again.wait(timeout=args.hang + 300)
        except subprocess.TimeoutExpired:
            _stop_child(again)
            r.second_exit = again.returncode
        finally:
            _stop_child(again)
        r.second = _figures(url, args.trials, log_dir, args.steps, reported_steps(args.steps, args.report_every))
        told = re.findall(
            r"Recorded the results of trial\(s\) \[([^\]]*)\]", Path(r.second_log).read_text(errors="replace")
        )
        r.outbox_told = sum(len([n for n in group.split(",") if n.strip()]) for group in told)
    return r


# -- what the logs say ------------------------------------------------------------------------------------------------
_RETRIED = re.compile(r"The storage failed to (.+?) \((\w+):")
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Expired)\b")
_STAMP = re.compile(r"^\[(\w) [0-9-]+ [0-9:,]+\] ")
_OTHERS = {
    "Recovery could not reach the storage": "(a recovery round ended by the outage)",
    "Could not write the sweep's heartbeat": "(a heartbeat not written)",
}


def retried_calls(text: str) -> collections.Counter:
    calls = collections.Counter(m.group(1) for m in _RETRIED.finditer(text))
    calls.update({name: text.count(start) for start, name in _OTHERS.items()})
    return +calls


def _traceback_digest(block: list[str]) -> list[str]:
    """A traceback as its frames in optuna_saturn (and the benchmark) and its exception lines."""
    keep = []
    for i, line in enumerate(block):
        frame = line.strip().startswith('File "')
        if frame and ("optuna_saturn" in line or "storage_outage" in line):
            keep.append(line.strip() + "  ->  " + (block[i + 1].strip() if i + 1 < len(block) else ""))
        elif _EXCEPTION.match(line):
            keep.append(line.strip()[:300])
    return keep


def why(path: str) -> list[str]:
    """The lines of a sweep's log that say why it aborted or what it could not store: each kind of warning and
    error once (with its count, its first time), and each kind of traceback once, cut to its frames in
    optuna_saturn and its exception lines."""
    lines = Path(path).read_text(errors="replace").splitlines()
    messages: dict[str, list] = {}
    tracebacks: dict[tuple, int] = {}
    block: list[str] | None = None

    def close(block: list[str]) -> None:
        digest = tuple(_traceback_digest(block))
        tracebacks[digest] = tracebacks.get(digest, 0) + 1

    for line in lines:
        if line.startswith("Traceback"):  # (a chained one's next part goes on the same block)
            block = [*(block or []), line]
            continue
        if block is not None:
            if _STAMP.match(line) or line.startswith(("sweep ", "[I")):
                close(block)
                block = None
            else:
                block.append(line)
                continue
        stamp = _STAMP.match(line)
        if (stamp and stamp.group(1) in "WEC") or "Stopping the sweep" in line:
            m = _RETRIED.search(line)
            key = f"The storage failed to {m.group(1)} ({m.group(2)})" if m else _STAMP.sub("", line)[:300]
            if key in messages:
                messages[key][1] += 1
            else:
                messages[key] = [line[:400], 1]
    if block is not None:
        close(block)
    out = [f"{count} x  {first}" for first, count in messages.values()]
    for digest, count in tracebacks.items():
        out.append(f"traceback, {count} x:")
        out += ["    " + line for line in digest]
    return out


# -- the report -------------------------------------------------------------------------------------------------------
def _cell(f: Figures | None, attr: str) -> str:
    return "-" if f is None else str(getattr(f, attr))


def table(rounds: list[Round]) -> str:
    head = (
        "| round | stop at (s after 1st report) | landed | down (s) | exit | aborted | wall (s) | COMPLETE ok | lost "
        "| RUNNING | FAIL | bad COMPLETE | left in outbox | late | 2nd optimize: exit | told from outbox | lost "
        "| RUNNING |"
    )
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rounds:
        rows.append(
            f"| {r.number} | {r.delay:.1f} | {r.landed} | {r.downtime:.0f} | "
            f"{'hung' if r.hung else r.exit_code} | {'yes' if r.aborted else 'no'} | {r.wall:.0f} | "
            f"{r.first.complete_ok} | {r.first.lost} | {r.first.running} | {r.first.fail} | {r.first.bad_complete} | "
            f"{r.first.outbox_left} | {r.first.late} | {'-' if r.second is None else r.second_exit} | "
            f"{'-' if r.second is None else r.outbox_told} | {_cell(r.second, 'lost')} | {_cell(r.second, 'running')} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--outage", type=float, default=60.0, help="seconds the server is down each round")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trials", type=int, default=4, help="trials per round's sweep (on 2 devices)")
    parser.add_argument("--steps", type=int, default=250, help="steps per trial")
    parser.add_argument("--step-sleep", type=float, default=0.1, help="seconds per step")
    parser.add_argument(
        "--report-every",
        type=int,
        default=1,
        help="report every K steps (and at the first); a K over --steps reports the first step only, so that "
        "trials run through the outage and their results are told while the server is down",
    )
    parser.add_argument("--recover", type=float, default=5.0, help="the sweep's recovery period (product: 30 s)")
    parser.add_argument(
        "--hang",
        type=float,
        default=400.0,
        help="a sweep not ended this long after the server came back is stopped and counted aborted",
    )
    parser.add_argument("--work", default=None, help="folder for the logs (default: a new temporary one)")
    args = parser.parse_args()

    import optuna
    from postgres import PostgresServer

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # (the server and the sweep stop on the way out)
    rng = random.Random(args.seed)
    span = math.ceil(args.trials / DEVICES) * args.steps * args.step_sleep
    delays = [rng.uniform(0, span) for _ in range(args.rounds)]  # (drawn up front: the seed alone decides them)
    work = args.work or tempfile.mkdtemp(prefix="saturn-outage-")
    os.makedirs(work, exist_ok=True)
    print(
        f"{args.rounds} rounds, outage {args.outage:g} s, seed {args.seed}, {args.trials} trials of "
        f"{args.steps * args.step_sleep:g} s on {DEVICES} devices, recovery every {args.recover:g} s; logs: {work}",
        flush=True,
    )
    rounds: list[Round] = []
    began = time.monotonic()
    server = PostgresServer()
    try:
        server.start()
        for number in range(1, args.rounds + 1):
            r = run_round(server, number, delays[number - 1], args, work)
            rounds.append(r)
            print(
                f"round {number}/{args.rounds}: stopped {r.delay:.1f} s after the first report ({r.landed}), down "
                f"{r.downtime:.0f} s; exit {'hung' if r.hung else r.exit_code}, {r.first.complete_ok} COMPLETE ok, "
                f"{r.first.lost} lost, {r.first.running} RUNNING, {r.first.fail} FAIL; {r.wall:.0f} s"
                + (
                    ""
                    if r.second is None
                    else f"; after a 2nd optimize: {r.second.lost} lost, "
                    f"{r.second.running} RUNNING, {r.outbox_told} told from the outbox"
                ),
                flush=True,
            )
    finally:
        with contextlib.suppress(OSError):
            shutil.copy(os.path.join(server.folder, "log"), os.path.join(work, "postgres.log"))
        server.remove()  # (pg_ctl stop by its data folder, then its folder removed)
    wall = time.monotonic() - began

    print()
    print(table(rounds))
    aborted = sum(r.aborted for r in rounds)
    lost = sum(r.first.lost for r in rounds)
    running = sum(r.first.running for r in rounds)
    fails = sum(r.first.fail for r in rounds)
    print(
        f"\n{len(rounds)} rounds in {wall:.0f} s (seed {args.seed}, outage {args.outage:g} s): {aborted} sweeps "
        f"aborted, {lost} results lost, {running} trials left RUNNING; {fails} trials FAIL (run again), "
        f"{sum(r.first.outbox_left for r in rounds)} results left in outboxes, {sum(r.first.late for r in rounds)} "
        "late results"
    )
    second = [r for r in rounds if r.second is not None]
    if second:
        print(
            f"after a second optimize (n_trials=0) on the {len(second)} rounds that did not hold: "
            f"{sum(r.second.lost for r in second)} results lost, {sum(r.second.running for r in second)} RUNNING, "
            f"{sum(r.outbox_told for r in second)} results told from the outbox"
        )
    calls: collections.Counter = collections.Counter()
    for r in rounds:
        calls.update(retried_calls(Path(r.log).read_text(errors="replace")))
    if calls:
        print("\nstorage calls retried during the outages (all rounds, retries counted):")
        for what, count in calls.most_common():
            print(f"- {what}: {count}")
    for r in rounds:
        if r.held and not r.first.fail and not r.first.bad_complete:
            continue
        print(f"\n### round {r.number}: why ({r.log})")
        for reason in r.first.fail_reasons:
            print(f"    FAIL {reason}")
        for line in why(r.log):
            print("    " + line)
        if r.second_log:
            print(f"  second optimize ({r.second_log}):")
            for line in why(r.second_log):
                print("    " + line)
    target = aborted == 0 and lost == 0 and running == 0 and len(rounds) == args.rounds
    print(f"\nissue 38 target (0 aborted, 0 lost, 0 RUNNING over {args.rounds} rounds): {'PASS' if target else 'FAIL'}")
    print(f"logs: {work}")
    sys.exit(0 if target else 1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--sweep":
        sweep(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
    else:
        main()
