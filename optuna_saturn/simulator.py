"""Discrete-event simulation of executing a plan when true runtimes differ from the estimates.

Why: a plan is only as good as its runtime estimates. The simulator measures what a static plan, an
introspectively re-planned execution (DESIGN.md decision 7) and a clairvoyant plan (made with the true runtimes)
achieve on the same noisy, partly pruned workload, without launching anything.

Dispatch rule: a job starts as soon as every device the current plan gives it is free and it is the next job on
each of those devices in plan order (so jobs may start earlier than planned, never on other devices). With
re-planning, every job end triggers ``replan`` for the jobs that have not started, with running jobs as busy
reservations held for their remaining time at their observed step rate (the executor measures it from the
trial's progress reports; with ``observe_step_rate=False``, at the estimated rate); a coming prune is not known.
The simulated clock does not include solver time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from optuna_saturn.planner import Assignment, Cluster, Job, Option, Plan, Reservation, replan, solve


@dataclass(frozen=True)
class SimulationResult:
    """What happened: the executed schedule (``end - start`` is the true runtime) and summary numbers."""

    makespan: float
    utilisation: float  # busy device-seconds / (devices * makespan)
    executed: tuple[Assignment, ...]
    planned_makespan: float  # the first plan's makespan, in estimated seconds
    replans: int = 0
    replaced: int = 0
    info: dict = field(default_factory=dict, compare=False)


def true_runtime(option: Option, job: str, noise: Mapping[str, float], prune_at: Mapping[str, float]) -> float:
    """The runtime ``job`` really takes with ``option``: estimate x noise factor, cut at the pruning fraction."""
    return option.runtime * noise.get(job, 1.0) * prune_at.get(job, 1.0)


def simulate(
    jobs: Sequence[Job],
    cluster: Cluster,
    *,
    noise: Mapping[str, float] | None = None,
    prune_at: Mapping[str, float] | None = None,
    mode: str = "static",
    solver: str = "auto",
    time_limit: float = 2.0,
    seed: int = 0,
    min_improvement: float = 0.02,
    plan: Plan | None = None,
    observe_step_rate: bool = True,
) -> SimulationResult:
    """Execute ``jobs`` with true runtimes ``estimate * noise[job] * prune_at[job]`` (defaults 1).

    ``mode``: "static" (plan once with the estimates, then dispatch), "replan" (re-plan at every job end) or
    "clairvoyant" (plan once with the true runtimes). ``plan`` skips the first solve (static or replan modes).
    """
    noise = dict(noise or {})
    prune_at = dict(prune_at or {})
    if mode not in ("static", "replan", "clairvoyant"):
        raise ValueError(f"mode must be 'static', 'replan' or 'clairvoyant', got {mode!r}.")
    if mode == "clairvoyant":
        truth = [Job(j.name, [replace(o, runtime=true_runtime(o, j.name, noise, prune_at))
                              for o in j.options]) for j in jobs]
        current = plan or solve(truth, cluster, solver=solver, time_limit=time_limit, seed=seed)
        # Map back to the estimated options so the true runtime is recomputed the same way as in other modes.
        est = {j.name: j for j in jobs}
        current = Plan(tuple(
            Assignment(a.job, _match(est[a.job], a.option), a.node, a.devices, a.start, a.end)
            for a in current.assignments), solver=current.solver)
    else:
        current = plan or solve(jobs, cluster, solver=solver, time_limit=time_limit, seed=seed)
    planned_makespan = current.makespan

    by_name = {j.name: j for j in jobs}
    pending: dict[str, Assignment] = {a.job: a for a in current.assignments}
    running: dict[str, tuple[Assignment, float, float]] = {}  # job -> (assignment, start, true end)
    executed: list[Assignment] = []
    queues = _queues(current)
    t = 0.0
    replans = replaced = 0
    while pending or running:
        started = True
        while started:
            started = False
            busy_devices = {(a.node, d) for a, _, _ in running.values() for d in a.devices}
            for name, a in sorted(pending.items(), key=lambda kv: (kv[1].start, kv[0])):
                keys = [(a.node, d) for d in a.devices]
                if any(k in busy_devices for k in keys) or any(queues[k][0] != name for k in keys):
                    continue
                end = t + true_runtime(a.option, name, noise, prune_at)
                running[name] = (a, t, end)
                del pending[name]
                for k in keys:
                    queues[k].pop(0)
                    busy_devices.add(k)
                started = True
        if not running:
            raise RuntimeError(f"Dispatch deadlock at t={t} with pending {sorted(pending)}; the plan is inconsistent.")
        t = min(end for _, _, end in running.values())
        for name in [n for n, (_, _, end) in running.items() if end <= t + 1e-12]:
            a, start, end = running.pop(name)
            executed.append(Assignment(name, a.option, a.node, a.devices, start, end))
        if mode == "replan" and pending:
            rate = noise if observe_step_rate else {}
            busy = [Reservation(a.node, a.devices, max(start + a.option.runtime * rate.get(n, 1.0) - t, 1e-6), job=n)
                    for n, (a, start, _) in running.items()]
            todo = [by_name[n] for n in pending]
            shifted = Plan(tuple(pending.values()))
            new = replan(shifted, todo, cluster, busy=busy, solver=solver, time_limit=time_limit, seed=seed,
                         min_improvement=min_improvement)
            replans += 1
            replaced += new.info.get("replan") == "replaced"
            pending = {a.job: a for a in new.assignments}
            queues = _queues(new)
    makespan = max((a.end for a in executed), default=0.0)
    work = sum(len(a.devices) * (a.end - a.start) for a in executed)
    util = work / (cluster.total_devices * makespan) if makespan > 0 else 0.0
    return SimulationResult(makespan, util, tuple(sorted(executed, key=lambda a: (a.start, a.job))),
                            planned_makespan, replans, replaced)


def _queues(plan: Plan) -> dict[tuple[int, int], list[str]]:
    """Per device, the jobs planned on it in start order (ties by end then name, so orders agree across devices)."""
    queues: dict[tuple[int, int], list[str]] = {}
    for a in sorted(plan.assignments, key=lambda a: (a.start, a.end, a.job)):
        for d in a.devices:
            queues.setdefault((a.node, d), []).append(a.job)
    return queues


def _match(job: Job, option: Option) -> Option:
    for o in job.options:
        if o.choice == option.choice:
            return o
    raise KeyError(f"{job.name}: {option}")
