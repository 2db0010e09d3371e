"""Chaos: faults at random points of real sweeps, and after each one the study must be consistent.

Faults here: ``kill -9`` of the executor at seeded points, observed in the study rather than timed (while the pool
starts, mid-trial, between trials, or not at all), over ``SATURN_CHAOS_ROUNDS`` rounds (default 3) on one SQLite
study; the first round's kill lands mid-trial. (The kill of one rank,
a rank that hangs, a locked storage: test_checkpoints.py and test_storage_faults.py.) After each round:

- no RUNNING trial lacks a live owner (none is left RUNNING once the next sweep has started);
- every COMPLETE value is present and unchanged;
- each interrupted trial was run again at most ``max_retries`` times;
- no process of the killed sweep remains;
- and at the end the study loads in optuna-dashboard.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from wsgiref.util import setup_testing_defaults

import objectives
import optuna
import psutil
import pytest
from optuna.trial import TrialState

from optuna_saturn import SaturnExecutor

HERE = os.path.dirname(__file__)
ROUNDS = int(os.environ.get("SATURN_CHAOS_ROUNDS", "3"))


#: Where a round's kill lands, observed in the study (not timed by the clock): while the pool starts (no trial of
#: the round has started), mid-trial (a trial of the round has reported a step and not ended), between trials (one
#: of the round's trials ended, another is asked but has reported nothing yet), or never (the sweep ends first).
EVENTS = ("pool starting", "mid-trial", "between trials", "not killed")


def _landed(study: optuna.Study, before: set[int]) -> str:
    """Where the sweep stands now, as :data:`EVENTS` names it: judged on this round's trials (not in ``before``)."""
    mine = [t for t in study.get_trials(deepcopy=False) if t.number not in before]
    running = [t for t in mine if t.state == TrialState.RUNNING]
    if any(t.intermediate_values for t in running):
        return "mid-trial"
    if any(t.state.is_finished() for t in mine) and not any(t.intermediate_values for t in running):
        return "between trials"
    return "pool starting" if not running else ""


def _sweep_killed_at(storage: str, log_dir: str, event: str, patience: float = 60.0) -> tuple[list, str]:
    """A sweep of 3 trials in a process of its own, killed with SIGKILL once the study shows ``event`` (or after
    ``patience`` seconds); returns its processes (to check that none survives) and where the kill landed."""
    study = optuna.load_study(study_name="killed", storage=storage)
    before = {t.number for t in study.get_trials(deepcopy=False)}
    sweep = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "sweep_to_kill.py"), storage, log_dir, "single,ddp", "2", "3"],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]),
            "SATURN_TEST_STEP_SLEEP": "0.1",
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + patience
    processes, landed = [], "not killed"
    while time.monotonic() < deadline and sweep.poll() is None:
        try:
            processes = [psutil.Process(sweep.pid), *psutil.Process(sweep.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        now = _landed(study, before)
        if event != "not killed" and now == event:
            sweep.send_signal(signal.SIGKILL)
            landed = event
            break
        time.sleep(0.05)
    if sweep.poll() is None and landed == "not killed" and event != "not killed":
        sweep.send_signal(signal.SIGKILL)  # (patience ran out)
        landed = "late"
    sweep.wait(timeout=120)
    return processes, landed


def _lives(owner: dict) -> bool:
    """Whether the owner's process lives: its pid, started when it says (a pid reused by another process is not
    the owner's)."""
    try:
        return abs(psutil.Process(owner["pid"]).create_time() - owner["started"]) < 2.0
    except psutil.NoSuchProcess:
        return False


def _check(study: optuna.Study, completed: dict[int, float], *, max_retries: int) -> None:
    trials = study.get_trials()
    for trial in trials:
        if trial.state == TrialState.RUNNING:  # the killed sweep's: its owner must be gone by now
            owner = trial.system_attrs["saturn:owner"]
            assert not _lives(owner), f"trial {trial.number} is RUNNING under a live sweep"
        assert trial.system_attrs.get("saturn:retries", 0) <= max_retries
    for number, value in completed.items():
        assert trials[number].state == TrialState.COMPLETE and trials[number].value == value
    completed.update({t.number: t.value for t in trials if t.state == TrialState.COMPLETE})


def _loads_in_optuna_dashboard(storage: str, study: optuna.Study) -> None:
    from optuna_dashboard import wsgi

    app = wsgi(storage)
    for path in ("/api/studies", f"/api/studies/{study._study_id}"):
        environ = {"PATH_INFO": path, "REQUEST_METHOD": "GET"}
        setup_testing_defaults(environ)
        status = []
        body = b"".join(app(environ, lambda s, headers, exc_info=None, status=status: status.append(s)))
        assert status[0].startswith("200"), (path, status, body[:500])
        json.loads(body)


@pytest.mark.launch
@pytest.mark.chaos
def test_kill_9_of_the_executor_at_random_points_leaves_a_consistent_study(saturn_options, tmp_path):
    storage = f"sqlite:///{tmp_path / 'chaos.sqlite3'}"
    optuna.create_study(study_name="killed", storage=storage)
    rng = random.Random(0)
    completed: dict[int, float] = {}
    # a kill mid-trial first (the case that matters most), then the others, then seeded choices
    events = [*EVENTS[1::-1], EVENTS[2], *(rng.choice(EVENTS) for _ in range(ROUNDS - 3))][:ROUNDS]
    landed: list[str] = []
    for round_, event in enumerate(events):
        processes, where = _sweep_killed_at(storage, str(tmp_path / f"round-{round_}"), event)
        landed.append(where)
        _gone, alive = psutil.wait_procs(processes, timeout=30)
        assert not alive, f"round {round_}: processes of the killed sweep survive: {alive}"
        _check(optuna.load_study(study_name="killed", storage=storage), completed, max_retries=1)
    assert landed[0] == "mid-trial", landed  # the kill landed where it was meant to
    study = optuna.load_study(study_name="killed", storage=storage)
    SaturnExecutor(devices=2, strategies=["single", "ddp"], **saturn_options).optimize(
        study, objectives.resumable, n_trials=1
    )
    trials = study.get_trials()
    assert not [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    _check(study, completed, max_retries=1)
    for trial in trials:
        if trial.state == TrialState.FAIL:
            assert trial.system_attrs["saturn:fail_reason"]
    _loads_in_optuna_dashboard(storage, study)
    print(
        f"chaos: {ROUNDS} rounds of kill -9, landed {landed}, all consistent; {len(trials)} trials: "
        f"{sum(t.state == TrialState.COMPLETE for t in trials)} COMPLETE, "
        f"{sum('saturn:retry_of' in t.user_attrs for t in trials)} run again, "
        f"{sum(t.state == TrialState.FAIL for t in trials)} FAIL"
    )
