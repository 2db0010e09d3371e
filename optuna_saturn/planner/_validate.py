"""An independent plan checker. Written apart from the solvers on purpose: it trusts nothing they compute."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from optuna_saturn.planner._goal import Goal
from optuna_saturn.planner._types import Cluster, Job, Plan, Reservation

_TOL = 1e-6


def plan_problems(
    plan: Plan, jobs: Sequence[Job], cluster: Cluster, *, busy: Sequence[Reservation] = (), goal: Goal | None = None
) -> list[str]:
    """Every way ``plan`` breaks the rules, as human-readable lines (empty when the plan is valid); with an
    ``goal``, its deadline or budget too (counted here, not by the goal)."""
    problems: list[str] = []
    by_name = {j.name: j for j in jobs}
    seen: dict[str, int] = defaultdict(int)
    # (node, device) -> list of (start, end, who)
    usage: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    for r in busy:
        for d in r.devices:
            usage[(r.node, d)].append((0.0, float(r.until), f"reservation {r.job or '?'}"))

    for a in plan.assignments:
        seen[a.job] += 1
        job = by_name.get(a.job)
        if job is None:
            problems.append(f"{a.job!r}: not one of the given jobs.")
            continue
        if a.option not in job.options:
            problems.append(f"{a.job!r}: option {a.option} is not one of the job's own options.")
        if not 0 <= a.node < len(cluster.nodes):
            problems.append(f"{a.job!r}: node {a.node} does not exist (cluster has {len(cluster.nodes)}).")
            continue
        size = cluster.nodes[a.node]
        if len(a.devices) != a.option.devices:
            problems.append(f"{a.job!r}: {len(a.devices)} devices given, option needs {a.option.devices}.")
        if len(set(a.devices)) != len(a.devices):
            problems.append(f"{a.job!r}: repeated device in {a.devices}.")
        bad = [d for d in a.devices if not (isinstance(d, int) and 0 <= d < size)]
        if bad:
            problems.append(f"{a.job!r}: devices {bad} are not in node {a.node} (size {size}).")
        if a.start < -_TOL:
            problems.append(f"{a.job!r}: starts before 0 ({a.start}).")
        if abs((a.end - a.start) - a.option.runtime) > _TOL * max(1.0, a.option.runtime):
            problems.append(f"{a.job!r}: end - start = {a.end - a.start}, option runtime is {a.option.runtime}.")
        for d in set(a.devices):
            usage[(a.node, d)].append((float(a.start), float(a.end), a.job))

    for name in by_name:
        if seen[name] == 0:
            problems.append(f"{name!r}: missing from the plan.")
        elif seen[name] > 1:
            problems.append(f"{name!r}: appears {seen[name]} times.")

    for (node, d), spans in sorted(usage.items()):
        spans.sort()
        last = None  # the span seen so far that ends last
        for s2, e2, w2 in spans:
            if e2 <= s2:  # zero-length spans overlap nothing
                continue
            if last is not None and s2 < last[1] - _TOL:
                s1, e1, w1 = last
                problems.append(f"node {node} device {d}: {w1} [{s1}, {e1}) overlaps {w2} [{s2}, {e2}).")
            if last is None or e2 > last[1]:
                last = (s2, e2, w2)
    if goal is not None:
        problems += _goal_problems(plan, goal)
    return problems


def _goal_problems(plan: Plan, goal: Goal) -> list[str]:
    end = max((float(a.end) for a in plan.assignments), default=0.0)
    spent = sum(len(a.devices) * (float(a.end) - float(a.start)) for a in plan.assignments)
    why = goal.violation(end, spent)  # (the end and the device-seconds counted here, not by the plan)
    return [why] if why else []


def validate(
    plan: Plan, jobs: Sequence[Job], cluster: Cluster, busy: Sequence[Reservation] = (), *, goal: Goal | None = None
) -> None:
    """Raise ``ValueError`` listing every problem if ``plan`` is not a valid schedule of ``jobs`` on ``cluster``.

    Checks: each job appears exactly once with one of its own options, on exactly ``option.devices`` distinct
    devices of one existing node, with ``end - start == runtime`` and ``start >= 0``; no device runs two things at
    once, busy reservations (devices held from 0 to ``until``) included; with a ``goal``, the plan ends by its
    deadline, or spends no more device-seconds than its budget.
    """
    problems = plan_problems(plan, jobs, cluster, busy=busy, goal=goal)
    if problems:
        raise ValueError("Invalid plan:\n  " + "\n  ".join(problems))
