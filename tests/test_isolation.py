"""The user's code runs only in the pool's processes (DESIGN decision 18): describing a trial runs its objective in
the describer, never in the executor's process. Whatever the objective does before its first ``trial.steps()``
loop (exit, kill itself, hang, leave a thread, fork, start DataLoader workers), the executor survives it, its
threads and children are what they were, and no trial is left RUNNING."""

from __future__ import annotations

import os
import threading
import time

import objectives
import optuna
import psutil
import pytest
from optuna.trial import TrialState

from optuna_saturn import SaturnExecutor

pytestmark = pytest.mark.launch

#: How each misbehaviour of trial 0 ends it: FAIL with a reason that says so, or COMPLETE (what it left is ended).
#: ``SystemExit`` and ``KeyboardInterrupt`` are raised from ``optimize`` too, as ``study.optimize`` raises them.
RAISED = {"sys.exit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt}
CASES = {
    "sys.exit": "raised SystemExit: 3",
    "KeyboardInterrupt": "raised KeyboardInterrupt",
    "os._exit": "exit code 7",
    "hang": "it took no first step in",  # (described for describe_timeout, then run: its start-up limit ends it)
    "thread": None,
    "fork": None,
    "loader": None,
}


def _new_threads(before: set[int | None]) -> list[str]:
    """The threads of this process that were not there ``before`` (ones that ended meanwhile do not count)."""
    return [t.name for t in threading.enumerate() if t.ident not in before]


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.parametrize("how", list(CASES))
def test_the_objective_never_runs_in_the_executor(how, tmp_path, monkeypatch, saturn_options) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("SATURN_TEST_PIDS", str(pids))
    monkeypatch.setenv("SATURN_TEST_MISBEHAVE", how)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="s")
    threads, children = {t.ident for t in threading.enumerate()}, _children()
    limits = {"stall_timeout": 5.0} if how == "hang" else {}
    executor = SaturnExecutor(devices=2, strategies=["single", "ddp"], describe_timeout=5, **limits, **saturn_options)
    if how in RAISED:
        with pytest.raises(RAISED[how]):
            executor.optimize(study, objectives.misbehaves_before_its_loop, n_trials=3)
    else:
        executor.optimize(study, objectives.misbehaves_before_its_loop, n_trials=3)

    states = {t.number: t.state for t in study.trials}
    assert TrialState.RUNNING not in states.values(), states
    first = study.trials[0]
    if CASES[how] is None:
        assert first.state == TrialState.COMPLETE, first.user_attrs
    else:
        assert first.state == TrialState.FAIL
        assert CASES[how] in first.system_attrs["saturn:fail_reason"], first.system_attrs["saturn:fail_reason"]
    if how not in RAISED:  # (no trial starts after an exception catch does not list)
        after = 3 if how == "hang" else 2  # (a run stopped by its limits runs again, as a rank that hung would)
        assert [t.state for t in study.trials[1:]] == [TrialState.COMPLETE] * after
    ran = [name.split("-", 1) for name in os.listdir(pids)]
    assert ran and all(int(pid) != os.getpid() for pid, _ in ran), ran  # described and run, never here
    assert "0" in {number for _, number in ran}
    # the executor's threads and children are as before: the pool and the describer are gone with the sweep (a
    # channel thread that served them may take a moment to see its connection close, on a loaded machine)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (_new_threads(threads) or _children() - children):
        time.sleep(0.1)
    assert not _new_threads(threads), _new_threads(threads)
    assert not _children() - children, [psutil.Process(p).cmdline() for p in _children() - children]
