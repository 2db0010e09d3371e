"""Run Optuna's own tests of ``Study.optimize`` (and of ``Trial`` through it) with every ``Study.optimize`` call
routed through ``SaturnExecutor``.

This file is the whole harness; Optuna's test files are not in the repository. ``run.sh`` (beside this file)
copies Optuna's ``tests/`` tree and this conftest into a scratch folder and runs pytest there: this file must be
the root conftest of that run, so that the patch is in place before any Optuna test runs.

For the session, ``optuna.study.Study.optimize`` becomes :func:`_through_saturn`: it builds a fresh
``SaturnExecutor(devices=2, strategies=["single"], progress=None, dashboard=False, log_dir=<tmp>,
profile_store=<tmp>)`` and calls its ``optimize`` with the same ``n_trials``, ``timeout``, ``n_jobs``, ``catch``,
``callbacks``, ``gc_after_trial`` and ``show_progress_bar`` (``n_jobs``: the most trials at once, on its 2
devices; ``show_progress_bar``: Optuna's own bar); every call that passed either is recorded.

Recursion: the executor never calls ``Study.optimize`` itself, and inside a worker process (a fork of this one, in
which the patch is also in place) an objective that calls ``study.optimize`` gets Optuna's original; a call made
while a call of this thread is routed (a callback that calls ``study.optimize``) gets the original too.

At the end of the session, the per-test outcome and the number of executor calls each test made are written to
``$OPTUNA_CONFORMANCE_REPORT`` (JSON, default ``<tmp>/optuna-conformance.json``), and the terminal summary says
how many passed tests never called ``Study.optimize``. ``OPTUNA_CONFORMANCE_BASELINE=1`` runs the same session
with Optuna's own ``optimize`` (calls still counted): what fails there fails without the executor;
``OPTUNA_CONFORMANCE_DEVICES=1`` gives the executor one device (trials one at a time, as ``n_jobs=1``).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

# The environment the project's own tests set (tests/conftest.py), before optuna_saturn is imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OPTUNA_SATURN_LEASES", "off")

import optuna
import pytest

from optuna_saturn import SaturnExecutor
from optuna_saturn.executor import WORKER_ENV

_ORIGINAL_OPTIMIZE = optuna.study.Study.optimize
#: each executor's log_dir and profile_store (kept after the session: the trials' and the pool's logs are there)
_SCRATCH = Path(tempfile.mkdtemp(prefix="executors-", dir=os.environ.get("OPTUNA_CONFORMANCE_SCRATCH")))
_routing = threading.local()

_calls: list[dict[str, Any]] = []  # every routed call of the running test
_per_test: dict[str, dict[str, Any]] = defaultdict(dict)
_executor_errors: list[str] = []  # executors that could not be built with strategies=["single"]
_counter = [0]
#: OPTUNA_CONFORMANCE_BASELINE=1: the same session, calls counted, but run by Optuna's own optimize (what fails
#: without the executor).
BASELINE = os.environ.get("OPTUNA_CONFORMANCE_BASELINE") == "1"
#: OPTUNA_CONFORMANCE_DEVICES=1: one device (trials one at a time, as n_jobs=1): tells the failures that come from
#: running trials concurrently from the others.
DEVICES = int(os.environ.get("OPTUNA_CONFORMANCE_DEVICES", "2"))


def _executor() -> SaturnExecutor:
    _counter[0] += 1
    folder = _SCRATCH / f"call-{_counter[0]}"
    options: dict[str, Any] = dict(
        progress=None, dashboard=False, log_dir=folder / "runs", profile_store=folder / "profiles"
    )
    try:
        return SaturnExecutor(devices=DEVICES, strategies=["single"], **options)
    except Exception as exc:  # (the defaults if "single" alone is refused)
        _executor_errors.append(repr(exc))
        return SaturnExecutor(devices=DEVICES, **options)


def _through_saturn(
    self: optuna.Study,
    func: Any,
    n_trials: int | None = None,
    timeout: float | None = None,
    n_jobs: int = 1,
    catch: Any = (),
    callbacks: Any = None,
    gc_after_trial: bool = False,
    show_progress_bar: bool = False,
) -> None:
    original = dict(
        n_trials=n_trials,
        timeout=timeout,
        n_jobs=n_jobs,
        catch=catch,
        callbacks=callbacks,
        gc_after_trial=gc_after_trial,
        show_progress_bar=show_progress_bar,
    )
    if os.environ.get(WORKER_ENV) or getattr(_routing, "active", False):
        return _ORIGINAL_OPTIMIZE(self, func, **original)
    _calls.append({"n_trials": n_trials, "timeout": timeout, "n_jobs": n_jobs, "show_progress_bar": show_progress_bar})
    if BASELINE:
        return _ORIGINAL_OPTIMIZE(self, func, **original)
    _routing.active = True
    try:
        _executor().optimize(
            self,
            func,
            n_trials=n_trials,
            timeout=timeout,
            catch=catch,
            callbacks=callbacks,
            gc_after_trial=gc_after_trial,
            n_jobs=n_jobs,
            show_progress_bar=show_progress_bar,
        )
    finally:
        _routing.active = False


_through_saturn.__doc__ = _ORIGINAL_OPTIMIZE.__doc__
optuna.study.Study.optimize = _through_saturn  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _count_routed_calls(request: pytest.FixtureRequest):
    _calls.clear()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    entry = _per_test[item.nodeid]
    if report.when == "setup" and report.outcome != "passed":
        entry["outcome"] = report.outcome
        if report.outcome == "failed":
            entry["error"] = "setup: " + (report.longreprtext.strip().splitlines() or [""])[-1][:400]
    elif report.when == "call":
        entry["outcome"] = report.outcome
        entry["seconds"] = round(report.duration, 2)
        entry["optimize_calls"] = len(_calls)
        entry["n_jobs"] = sorted({c["n_jobs"] for c in _calls})
        entry["show_progress_bar"] = any(c["show_progress_bar"] for c in _calls)
        if report.outcome == "failed":
            entry["error"] = report.longreprtext.strip().splitlines()[-1][:400] if report.longreprtext else ""
    elif report.when == "teardown" and report.outcome == "failed":
        entry["teardown"] = "failed"
    if report.when == "teardown":
        _write_report()  # (after every test: a run stopped by its timeout still leaves what it did)


def _report_path() -> Path:
    return Path(os.environ.get("OPTUNA_CONFORMANCE_REPORT", Path(tempfile.gettempdir()) / "optuna-conformance.json"))


def _write_report() -> None:
    _report_path().write_text(
        json.dumps({"baseline": BASELINE, "tests": _per_test, "executor_errors": _executor_errors}, indent=1)
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    path = _report_path()
    _write_report()
    passed = [e for e in _per_test.values() if e.get("outcome") == "passed"]
    routed = [e for e in passed if e.get("optimize_calls")]
    failed = [e for e in _per_test.values() if e.get("outcome") == "failed"]
    terminalreporter.write_sep(
        "=", "optuna conformance: " + ("BASELINE, Optuna's own optimize" if BASELINE else "through SaturnExecutor")
    )
    terminalreporter.write_line(
        f"passed {len(passed)} (called optimize: {len(routed)}, never called optimize: "
        f"{len(passed) - len(routed)}); failed {len(failed)} (of which called optimize: "
        f"{sum(1 for e in failed if e.get('optimize_calls'))}); report: {path}"
    )
    if _executor_errors:
        terminalreporter.write_line(f"strategies=['single'] refused, defaults used: {_executor_errors[0]}")
