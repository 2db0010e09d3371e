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

from optuna_saturn.planner import (
    Assignment, Cluster, Job, Option, Plan, Reservation, best_resize, remaining_job, replan, solve,
)


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
    resize_seconds: float | Mapping[str, float] | None = None,
    resize_solver: str = "list",
    max_moves: int = 2,
) -> SimulationResult:
    """Execute ``jobs`` with true runtimes ``estimate * noise[job] * prune_at[job]`` (defaults 1).

    ``mode``: "static" (plan once with the estimates, then dispatch), "replan" (re-plan at every job end) or
    "clairvoyant" (plan once with the true runtimes). ``plan`` skips the first solve (static or replan modes).

    ``resize_seconds`` (re-plan mode only) turns on elastic resize: at every job end a running job may also be
    stopped and restarted under another option (:func:`~optuna_saturn.planner.best_resize`, planned with
    ``resize_solver``), resuming at the fraction of its steps it had done after ``resize_seconds`` (one number,
    or per job) of checkpoint and restart; each job moves at most ``max_moves`` times. ``info["resizes"]``
    counts the moves.
    """
    noise = dict(noise or {})
    prune_at = dict(prune_at or {})
    if mode not in ("static", "replan", "clairvoyant"):
        raise ValueError(f"mode must be 'static', 'replan' or 'clairvoyant', got {mode!r}.")
    if resize_seconds is not None and mode != "replan":
        raise ValueError("resize_seconds needs mode='replan': a job is moved when the sweep re-plans.")
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

    by_name = {j.name: j for j in jobs}  # the jobs as given (true runtimes come from these options)
    to_plan = dict(by_name)  # what re-planning sees: a moved job as its remaining steps plus its restart
    resumes: dict[str, tuple[float, float]] = {}  # a moved job: (fraction of its steps done, restart seconds)
    moves: dict[str, int] = {}
    pending: dict[str, Assignment] = {a.job: a for a in current.assignments}
    running: dict[str, _Segment] = {}
    executed: list[Assignment] = []
    queues = _queues(current)
    t = 0.0
    replans = replaced = 0
    rate = noise if observe_step_rate else {}
    while pending or running:
        started = True
        while started:
            started = False
            busy_devices = {(s.assignment.node, d) for s in running.values() for d in s.assignment.devices}
            for name, a in sorted(pending.items(), key=lambda kv: (kv[1].start, kv[0])):
                keys = [(a.node, d) for d in a.devices]
                if any(k in busy_devices for k in keys) or any(queues[k][0] != name for k in keys):
                    continue
                option = _match(by_name[name], a.option)
                done, restart = resumes.pop(name, (0.0, 0.0))
                full = option.runtime * noise.get(name, 1.0)
                end = t + restart + max(0.0, prune_at.get(name, 1.0) - done) * full
                running[name] = _Segment(replace(a, option=option), t, end, restart, done, full)
                del pending[name]
                for k in keys:
                    queues[k].pop(0)
                    busy_devices.add(k)
                started = True
        if not running:
            raise RuntimeError(f"Dispatch deadlock at t={t} with pending {sorted(pending)}; the plan is inconsistent.")
        t = min(s.end for s in running.values())
        for name in [n for n, s in running.items() if s.end <= t + 1e-12]:
            s = running.pop(name)
            executed.append(replace(s.assignment, start=s.start, end=s.end))
        if mode == "replan" and (pending or (resize_seconds is not None and running)):
            busy = [Reservation(s.assignment.node, s.assignment.devices,
                                max(s.start + s.restart + (1.0 - s.done) * s.assignment.option.runtime
                                    * rate.get(n, 1.0) - t, 1e-6), job=n)
                    for n, s in running.items()]
            todo = [to_plan[n] for n in pending]
            shifted = Plan(tuple(pending.values()))
            move = None
            if resize_seconds is not None:
                movable = {}
                for n, s in running.items():
                    rest = remaining_job(n, by_name[n].options, current=s.assignment.option.choice,
                                         left=1.0 - s.progress(t), rate=rate.get(n, 1.0),
                                         restart=_cost(resize_seconds, n))
                    if rest is not None and moves.get(n, 0) < max_moves:
                        movable[n] = rest
                move = best_resize(todo, cluster, busy=busy, movable=movable, previous=shifted if pending else None,
                                   solver=resize_solver, time_limit=time_limit, seed=seed,
                                   min_improvement=min_improvement,
                                   min_gain={n: _cost(resize_seconds, n) for n in movable}) if movable else None
            if move is not None:
                s = running.pop(move.job)
                executed.append(replace(s.assignment, start=s.start, end=t))
                resumes[move.job] = (s.progress(t), _cost(resize_seconds, move.job))
                to_plan[move.job] = movable[move.job]
                moves[move.job] = moves.get(move.job, 0) + 1
                pending = {a.job: a for a in move.plan.assignments}
                queues = _queues(move.plan)
                replans += 1
            elif pending:
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
                            planned_makespan, replans, replaced, info={"resizes": sum(moves.values())})


@dataclass(frozen=True)
class _Segment:
    """A job running from ``start``: ``restart`` seconds of restart first (a moved job), then its steps from the
    fraction ``done`` on, each fraction taking ``full`` (its whole true runtime on this option) seconds."""

    assignment: Assignment
    start: float
    end: float
    restart: float
    done: float
    full: float

    def progress(self, t: float) -> float:
        """The fraction of its steps done at ``t``, as its progress reports would tell."""
        return min(1.0, self.done + max(0.0, t - self.start - self.restart) / self.full) if self.full > 0 else 1.0


def _cost(resize_seconds: float | Mapping[str, float], job: str) -> float:
    return resize_seconds.get(job, 0.0) if isinstance(resize_seconds, Mapping) else float(resize_seconds)


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
