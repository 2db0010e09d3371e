"""Two sweeps on one PostgreSQL study, each in a PID namespace of its own on this host (as two containers would
be), one of them killed with ``kill -9`` at seeded random points and started again, round after round. What it
checks, after every round and at the end (issue 26's target):

- 0 results lost: every COMPLETE value stays present and unchanged;
- 0 trials told twice: no late result (a live sweep's result for a trial another ended), no trial run again twice;
- 0 RUNNING trials at the end (nor WAITING ones);
- every interrupted trial run again exactly once (``max_retries=1``; a run again that was itself interrupted is
  not run a third time).

Across PID namespaces the pid of the other sweep means nothing, so each sweep judges the other by its heartbeat
alone: whether it changed, on the judge's clock. To keep rounds short, the sweeps here take a heartbeat silent for
``--stale`` seconds (default 15; the product's is 60) for gone, and look every 5 s (30 s). The steady sweep asks 8
trials (about 40 s) and is started again whenever it finishes; the victim asks 2 trials a round and is killed
``uniform(0, --kill-within)`` seconds after it starts (seeded), wherever that lands: while its pool starts,
mid-trial, between trials, or after it ended. Needs root (``unshare``), PostgreSQL's server (``initdb``) and ``ip``.

    python benchmarks/chaos_two_namespaces.py --rounds 20 [--seed 0]
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")
sys.path[:0] = [os.path.dirname(HERE), TESTS]

STUDY = "chaos"


def sweep(storage: str, log_dir: str, n_trials: int, stale: float) -> None:
    """One sweep (run as ``--sweep``, inside ``unshare -p -f --mount-proc``: it is PID 1 of its namespace)."""
    import objectives
    import optuna

    from optuna_saturn import SaturnExecutor
    from optuna_saturn.study import liveness
    from optuna_saturn.sweep import loop

    liveness.STALE_AFTER_SECONDS = stale
    loop.RECOVER_SECONDS = 5.0
    print(f"sweep pid {os.getpid()} in {os.readlink('/proc/self/ns/pid')}", flush=True)
    study = optuna.load_study(study_name=STUDY, storage=storage)
    SaturnExecutor(
        devices=1,
        strategies=["single"],
        isolate_network=True,
        log_dir=log_dir,
        max_retries=1,
        profile_store=f"{log_dir}/profiles",
        progress="plain",
        dashboard=False,
    ).optimize(study, objectives.resumable, n_trials=n_trials)


def _start(storage: str, log_dir: str, n_trials: int, stale: float) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([TESTS, os.path.dirname(HERE)]),
        "SATURN_TEST_STEP_SLEEP": "0.1",
        "SATURN_TEST_CHECKPOINT_EVERY": "6",
    }
    log = open(f"{log_dir}.log", "ab")  # noqa: SIM115 (the process writes it; closed with this one's end)
    return subprocess.Popen(
        [
            "unshare",
            "-p",
            "-f",
            "--mount-proc",
            sys.executable,
            os.path.abspath(__file__),
            "--sweep",
            storage,
            log_dir,
            str(n_trials),
            str(stale),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _where(study, namespace: str) -> str:
    """Where the victim (the sweep in PID namespace ``namespace``) stands, as its trials in the study show it."""
    from optuna.trial import TrialState

    mine = [
        t
        for t in study.get_trials(deepcopy=False)
        if (t.system_attrs.get("saturn:owner") or {}).get("pid_namespace") == namespace
    ]
    running = [t for t in mine if t.state == TrialState.RUNNING]
    if any(t.intermediate_values for t in running):
        return "mid-trial"
    if running:
        return "trial starting"
    return "between trials" if mine else "pool starting"


class Ledger:
    """What the study held after each round, to find a result lost or changed, or a trial run again twice."""

    def __init__(self) -> None:
        self.completed: dict[int, float] = {}
        self.problems: list[str] = []

    def check(self, study, *, final: bool) -> None:
        from optuna.trial import TrialState

        trials = study.get_trials(deepcopy=False)
        for number, value in self.completed.items():
            if trials[number].state != TrialState.COMPLETE or trials[number].value != value:
                self.problems.append(f"trial {number}'s result {value} was lost or changed")
        self.completed.update({t.number: t.value for t in trials if t.state == TrialState.COMPLETE})
        late = [k for k in study.user_attrs if k.startswith("saturn:late_result:")]
        if late:
            self.problems.append(f"results told after another sweep ended their trial: {late}")
        runs_again = collections.Counter(t.user_attrs.get("saturn:retry_of") for t in trials)
        runs_again.pop(None, None)
        twice = [n for n, count in runs_again.items() if count > 1]
        if twice:
            self.problems.append(f"trials run again more than once: {twice}")
        if final:
            left = [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
            if left:
                self.problems.append(f"trials left RUNNING or WAITING: {left}")
            for t in trials:
                interrupted = "the sweep that ran it died" in t.system_attrs.get(
                    "saturn:fail_reason", ""
                ) or "no live sweep runs it" in t.system_attrs.get("saturn:fail_reason", "")
                if interrupted and int(t.system_attrs.get("saturn:retries", 0)) < 1 and runs_again[t.number] != 1:
                    self.problems.append(f"interrupted trial {t.number} was run again {runs_again[t.number]} times")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stale", type=float, default=15.0, help="seconds of an unchanged heartbeat that mean gone")
    parser.add_argument("--kill-within", type=float, default=14.0, help="the victim is killed within this many s")
    args = parser.parse_args()

    import optuna
    from optuna.trial import TrialState
    from postgres import postgres_server

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # (the server and sweeps stop on the way out)
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="saturn-chaos-")
    ledger, landed, held = Ledger(), [], 0
    began = time.monotonic()
    with postgres_server() as server:
        storage = server.create_database("chaos")
        study = optuna.create_study(study_name=STUDY, storage=storage)
        steady = _start(storage, f"{work}/steady-0", 8, args.stale)
        restarts = 0
        for round_ in range(args.rounds):
            victim = _start(storage, f"{work}/victim-{round_}", 2, args.stale)
            kill_at = time.monotonic() + rng.uniform(0, args.kill_within)
            while time.monotonic() < kill_at and victim.poll() is None:
                if steady.poll() is not None:
                    restarts += 1
                    steady = _start(storage, f"{work}/steady-{restarts}", 8, args.stale)
                time.sleep(0.05)
            where = "after it ended" if victim.poll() is not None else _where(study, _namespace(victim))
            _kill_namespace(victim)
            victim.wait(timeout=60)
            landed.append(where)
            problems = len(ledger.problems)
            ledger.check(study, final=False)
            held += len(ledger.problems) == problems
            print(
                f"round {round_ + 1}/{args.rounds}: killed {where}; {len(ledger.problems)} problems so far", flush=True
            )
        steady.wait(timeout=600)
        # The last victim's trials: a sweep recovers them once it has seen their beat silent for the stale period
        # (a sweep shorter than that cannot judge a sweep in another namespace), so the last sweeps ask 6 trials
        # (about 25 s: the stale period, and a look after it).
        for again in range(5):
            if not any(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in study.get_trials(deepcopy=False)):
                break
            _start(storage, f"{work}/last-{again}", 6, args.stale).wait(timeout=600)
        ledger.check(study, final=True)
        trials = study.get_trials(deepcopy=False)
    states = collections.Counter(t.state.name for t in trials)
    interrupted = sum("saturn:retry_of" in t.user_attrs for t in trials)
    reasons = collections.Counter(_why(t) for t in trials if t.state == TrialState.FAIL)
    print(
        f"\n{args.rounds} rounds run, {held} held, in {time.monotonic() - began:.0f} s (seed {args.seed}); kills "
        f"landed: {dict(collections.Counter(landed))}; the steady sweep was started {restarts + 1} times"
    )
    print(
        f"{len(trials)} trials: {dict(states)}; {interrupted} run again; FAIL: {dict(reasons)}; "
        f"{len(ledger.problems)} problems"
    )
    for problem in ledger.problems:
        print(" -", problem)
    print(f"logs: {work}")
    sys.exit(1 if ledger.problems else 0)


def _why(trial) -> str:
    reason = trial.system_attrs.get("saturn:fail_reason", "")
    kind = (
        "its sweep died"
        if "the sweep that ran it died" in reason
        else "no live sweep listed it"
        if "no live sweep runs it" in reason
        else reason[:60]
    )
    return kind + (", not run again (max_retries)" if "max_retries" in reason else ", run again")


def _executor(victim: subprocess.Popen):
    """``unshare -f`` forks the namespace's PID 1 (the sweep's executor) and waits for it."""
    import psutil

    try:
        children = psutil.Process(victim.pid).children()
    except psutil.NoSuchProcess:
        return None
    return children[0] if children else None


def _namespace(victim: subprocess.Popen) -> str:
    executor = _executor(victim)
    try:
        return os.readlink(f"/proc/{executor.pid}/ns/pid") if executor is not None else ""
    except OSError:
        return ""


def _kill_namespace(victim: subprocess.Popen) -> None:
    """kill -9 of the executor, PID 1 of its namespace: the kernel then kills every process in it."""
    executor = _executor(victim)
    if executor is not None:
        executor.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--sweep":
        sweep(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
    else:
        main()
