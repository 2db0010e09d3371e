"""The soak's end checks (``benchmarks/soak.py``, ``tests/test_soak.py``), from the study alone and from what is
left on the machine.

- every trial asked (one that is no run again) ends COMPLETE with the value its params give, or FAIL with a reason
  (``saturn:fail_reason``) and exactly one run again (``saturn:retry_of`` names it, with the same params), which
  ends the same way in turn: a chain that ends otherwise is **lost**;
- nothing is RUNNING or WAITING: else **stuck**;
- no params ran twice except a FAIL's run again: two trials asked with the same params, two runs again of one
  trial, or a run again of a trial that did not fail, are **duplicates**;
- no process, thread, descriptor, lease, temporary folder or untold result file is left: else **leaks**.
"""

from __future__ import annotations

import collections
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from optuna.trial import FrozenTrial, TrialState
from soak_sweep import STEPS, expected

from optuna_saturn.study.records import record


@dataclass
class Verdict:
    asked: int = 0
    complete: int = 0
    failed_and_retried: int = 0
    lost: int = 0
    stuck: int = 0
    duplicates: int = 0
    leaks: int = 0
    problems: list[str] = field(default_factory=list)

    def problem(self, kind: str, text: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        self.problems.append(f"{kind}: {text}")

    @property
    def held(self) -> bool:
        return not (self.lost or self.stuck or self.duplicates or self.leaks)


def _describe(t: FrozenTrial) -> str:
    keys = ("owner", "fail_reason", "devices", "strategy", "retries", "retry_of")
    return f"trial {t.number} {t.state.name} params={t.params} " + str(
        {k: record(t, k) for k in keys if record(t, k) is not None}
    )


def _right(t: FrozenTrial) -> bool:
    x = t.params.get("x")
    if x is None or t.value is None:
        return False
    reports = t.intermediate_values
    return (
        math.isclose(t.value, expected(x, STEPS - 1))
        and sorted(reports) == list(range(STEPS))
        and all(math.isclose(v, expected(x, s)) for s, v in reports.items())
    )


def check_trials(trials: list[FrozenTrial], verdict: Verdict) -> None:
    retries: dict[int, list[FrozenTrial]] = collections.defaultdict(list)
    for t in trials:
        if record(t, "retry_of") is not None:
            retries[int(record(t, "retry_of"))].append(t)
    by_number = {t.number: t for t in trials}
    origins = [t for t in trials if record(t, "retry_of") is None]
    verdict.asked = len(origins)
    for t in trials:
        if t.state in (TrialState.RUNNING, TrialState.WAITING):
            verdict.problem("stuck", _describe(t))
    seen = collections.Counter(tuple(sorted(t.params.items())) for t in origins if t.params)  # ({}: none asked)
    for params, count in seen.items():
        if count > 1:
            verdict.problem("duplicates", f"{count} trials asked with params {dict(params)}")
    for number, again in retries.items():
        before = by_number.get(number)
        if len(again) > 1:
            verdict.problem(
                "duplicates", f"trial {number} was run again {len(again)} times: {[a.number for a in again]}"
            )
        if before is None or before.state != TrialState.FAIL:
            verdict.problem("duplicates", f"run again of a trial that did not fail: {[_describe(a) for a in again]}")
        for a in again:
            if before is not None and before.params and a.params != before.params:
                verdict.problem("duplicates", f"run again with other params: {_describe(a)} of {_describe(before)}")
    for origin in origins:
        t, chain = origin, []
        while True:
            chain.append(t)
            if t.state == TrialState.COMPLETE:
                if _right(t):
                    verdict.complete += 1
                    verdict.failed_and_retried += len(chain) > 1
                else:
                    verdict.problem("lost", f"a wrong result or report: {_describe(t)}")
                break
            if t.state != TrialState.FAIL or not record(t, "fail_reason"):
                if t.state not in (TrialState.RUNNING, TrialState.WAITING):  # (counted stuck already)
                    verdict.problem("lost", f"ended {t.state.name} without a reason: {_describe(t)}")
                break
            if not retries.get(t.number):
                verdict.problem("lost", "a FAIL not run again: " + " <- ".join(_describe(c) for c in chain))
                break
            t = retries[t.number][0]


def check_leftovers(
    verdict: Verdict,
    *,
    processes: list,
    leak_files: list[Path],
    lease_folders: list[Path],
    temp_folder: Path,
    log_dir: Path,
) -> None:
    from optuna_saturn.leases import current_leases

    for p in processes:
        verdict.problem("leaks", f"process {p.pid} left: {' '.join(p.cmdline())[:200]}")
    for path in leak_files:
        data = json.loads(path.read_text())
        new = collections.Counter(data["after"]["threads"]) - collections.Counter(data["before"]["threads"])
        if new:
            verdict.problem("leaks", f"sweep {data['pid']} left threads {sorted(new.elements())}")
        if data["after"]["fds"] > data["before"]["fds"]:
            verdict.problem(
                "leaks", f"sweep {data['pid']}: {data['before']['fds']} -> {data['after']['fds']} descriptors"
            )
    for folder in lease_folders:
        held = [(name, holder) for name, holder in current_leases(folder) if holder is not None]
        if held:
            verdict.problem("leaks", f"leases held in {folder}: {held}")
    for entry in sorted(temp_folder.glob("optuna-saturn-*")):
        verdict.problem("leaks", f"temporary folder left: {entry}")
    for untold in sorted(log_dir.glob("outbox/*/trial-*.json")):
        verdict.problem("leaks", f"a result never told left in the outbox: {untold}")
