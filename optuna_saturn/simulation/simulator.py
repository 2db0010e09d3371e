"""Simulation of a sweep: the real loop on a simulated pool, a virtual clock and an in-memory study.

Why: a plan is only as good as its runtime estimates, and a scheduling rule is worth only what it does on the
sweeps that run it. The simulator measures what the scheduler that ships achieves when true runtimes differ from
the estimates and trials are pruned, without launching anything, on any number of devices: every job is enqueued
in an in-memory study (its index as the fixed parameter ``job``), the real loop plans, dispatches, re-plans,
moves and tells them (DESIGN.md decision 12), and a job ends when its true runtime says, pruned where
``prune_at`` says. Nothing here models scheduling: only the world the scheduler acts on.

Modes: ``"replan"`` is the executor as it ships (re-planning at every event); ``"static"`` keeps every trial where
its first plan placed it (the dispatcher still starts it as soon as its devices are free); ``"clairvoyant"``
prices every option with its true runtime (prune included).
"""

from __future__ import annotations

import contextlib
import logging
import math
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial

from optuna_saturn.clock import VirtualClock
from optuna_saturn.devices import Device
from optuna_saturn.events import SweepListener, TrialMove, TrialStart
from optuna_saturn.planner import MAKESPAN, Assignment, Cluster, Goal, Job, Plan, WorkLimit
from optuna_saturn.simulation.known_prices import JOB_PARAMETER, KnownPrices, SimulatedJob
from optuna_saturn.simulation.pool import Behaviour, Fault, SimulatedPool
from optuna_saturn.strategy import Strategy, load_strategies
from optuna_saturn.sweep import SweepSettings, assemble

MODES = ("static", "replan", "clairvoyant")


@dataclass(frozen=True)
class SimulationResult:
    """What happened: the executed schedule (``end - start`` is the true runtime; a moved trial has one entry per
    run) and summary numbers."""

    makespan: float
    utilisation: float  # busy device-seconds / (devices * makespan)
    executed: tuple[Assignment, ...]
    planned_makespan: float  # the first plan's makespan, in estimated seconds
    replans: int = 0
    replaced: int = 0
    info: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Overheads:
    """The time a real sweep spends beside its trials' runtimes, as the simulated world charges it: its workers'
    start, describing each trial (in the loop's thread), and each run's start-up before its first step."""

    workers_ready: float = 0.0
    describe: float | Mapping[str, float] = 0.0  # seconds per trial (or per job name)
    startup: float | Mapping[str, float] = 0.0  # seconds per run, within its runtime


def simulate(
    jobs: Sequence[Job],
    cluster: Cluster,
    *,
    noise: Mapping[str, float] | None = None,
    prune_at: Mapping[str, float] | None = None,
    mode: str = "static",
    solver: str = "auto",
    work_limit: float = 2.0,
    seed: int = 0,
    min_improvement: float = 0.02,
    plan: Plan | None = None,
    observe_step_rate: bool = True,
    resize_seconds: float | Mapping[str, float] | None = None,
    max_moves: int = 2,
    overheads: Overheads | None = None,
    known_ahead: bool = True,
    tick: float = 0.0,
    steps: int = 100,
    plan_for_pruning: bool = False,
    plan_to_next_rung: bool = False,
    time_limit: float | None = None,
) -> SimulationResult:
    """Run ``jobs`` on ``cluster`` with true runtimes ``estimate * noise[job]``, each pruned after the share
    ``prune_at[job]`` of its steps (defaults 1), through the real sweep loop.

    ``mode``: see the module's docstring. ``plan``: the first trials' plan (a replay). ``resize_seconds`` (re-plan
    mode) turns elastic resize on: trials checkpoint every tenth of their steps, and a moved trial's next run
    starts that much later (one number, or per job); at most ``max_moves`` moves per trial (``info["resizes"]``).
    ``observe_step_rate=False``: running trials do not report their step rate, so the loop holds them for their
    planned runtime. ``overheads``: start-up, describing and per-run set-up (none by default). ``known_ahead``:
    the jobs are known before they are asked (an enqueued set) or arrive one by one (sampled trials).
    ``tick``: the loop's periodic wake-ups in virtual seconds (events are never skipped; 0 keeps the real ones).
    ``plan_for_pruning``: price each trial at the share of its steps the finished trials say it will run under the
    study's pruner (:mod:`optuna_saturn.pricing.survival`); by default every trial is priced at its full length
    (pruning-blind planning; the clairvoyant mode always is, as it prices with the pruned runtimes themselves).
    ``plan_to_next_rung``: that too, and a trial more likely pruned at its next rung than not is offered only its
    most efficient options until it survives the rung (:mod:`optuna_saturn.sweep.options`).
    ``work_limit`` is the planner's work per plan, in units of :class:`~optuna_saturn.planner.WorkLimit`, not
    seconds (see :func:`run_simulation`); ``time_limit``, its old name, is deprecated.
    """
    work_limit = _work_units(work_limit, time_limit)
    if mode not in MODES:
        raise ValueError(f"mode must be 'static', 'replan' or 'clairvoyant', got {mode!r}.")
    if resize_seconds is not None and mode != "replan":
        raise ValueError("resize_seconds needs mode='replan': a job is moved when the sweep re-plans.")
    noise, prune_at, overheads = dict(noise or {}), dict(prune_at or {}), overheads or Overheads()
    simulated = [
        SimulatedJob(
            job,
            Behaviour(
                {o.choice: o.runtime * noise.get(job.name, 1.0) for o in job.options},
                steps=steps,
                prune_at=prune_at.get(job.name, 1.0),
                startup=_per_job(overheads.startup, job.name),
                restart=_per_job(resize_seconds or 0.0, job.name),
                checkpoint_every=max(steps // 10, 1) if resize_seconds is not None else None,
            ),
            describe_seconds=_per_job(overheads.describe, job.name),
        )
        for job in jobs
    ]
    return run_simulation(
        simulated,
        cluster,
        mode=mode,
        solver=solver,
        work_limit=work_limit,
        seed=seed,
        min_improvement=min_improvement,
        plan=plan,
        observe_step_rate=observe_step_rate,
        elastic=resize_seconds is not None,
        max_moves=max_moves,
        workers_ready=overheads.workers_ready,
        known_ahead=known_ahead,
        tick=tick,
        plan_for_pruning=plan_for_pruning and mode != "clairvoyant",
        plan_to_next_rung=plan_to_next_rung and mode != "clairvoyant",
    )


def run_simulation(
    jobs: Sequence[SimulatedJob],
    cluster: Cluster,
    *,
    mode: str = "replan",
    solver: str = "auto",
    work_limit: float = 2.0,
    seed: int = 0,
    min_improvement: float = 0.02,
    plan: Plan | None = None,
    observe_step_rate: bool = True,
    elastic: bool = False,
    max_moves: int = 2,
    workers_ready: float | Sequence[float] = 0.0,
    known_ahead: bool = True,
    tick: float = 0.0,
    faults: Sequence[Fault] = (),
    n_trials: int | None = None,
    batch_size: int | None = None,
    timeout: float | None = None,
    listeners: Sequence[SweepListener] = (),
    callbacks: Sequence[Callable[[optuna.Study, FrozenTrial], None]] = (),
    study: optuna.Study | None = None,
    stall_timeout: float | None = None,
    max_retries: int = 1,
    profile_budget: float | None = None,
    plan_for_pruning: bool = False,
    plan_to_next_rung: bool = False,
    goal: Goal = MAKESPAN,
    time_limit: float | None = None,
) -> SimulationResult:
    """The real loop on ``jobs`` (see :func:`simulate`), with ``faults`` injected into the simulated pool, planning
    for ``goal`` (:class:`~optuna_saturn.planner.Makespan`, ``Deadline`` or ``Budget``). A
    ``study`` given must hold ``jobs`` enqueued (their index as the parameter ``job``); by default an in-memory
    one is made.

    The sweep plans by work, not by the wall clock (``work_limit``: units of
    :class:`~optuna_saturn.planner.WorkLimit` per plan; ``time_limit``, its old name, is deprecated), so the same
    arguments give the same sweep, to the second, on any machine, however busy."""
    work_limit = _work_units(work_limit, time_limit)
    clock = VirtualClock()
    devices = simulated_devices(cluster)
    strategies = simulated_strategies(o.strategy for j in jobs for o in j.job.options)
    prices = KnownPrices(jobs, strategies, clock, known_ahead=known_ahead, clairvoyant=mode == "clairvoyant")
    if study is None:
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
        for index in range(len(jobs)):
            study.enqueue_trial({JOB_PARAMETER: index})
    record = _Record(clock, prices)
    with tempfile.TemporaryDirectory(prefix="optuna-saturn-simulation-") as folder, _quiet():
        settings = SweepSettings(
            devices=devices,
            strategies=strategies,
            solver=solver,
            time_limit=math.inf,  # (never read: plan_work replaces the wall clock's limit)
            log_dir=Path(folder),
            listeners=(record, *listeners),
            elastic=elastic,
            replan=mode != "static",
            min_improvement=min_improvement,
            seed=seed,
            plan_work=WorkLimit(work_limit),
            first_plan=_numbered(plan, jobs) if plan is not None else None,
            max_moves=max_moves,
            owned=False,
            stall_timeout=stall_timeout,
            max_retries=max_retries,
            profile_budget=profile_budget,
            plan_for_pruning=plan_for_pruning,
            plan_to_next_rung=plan_to_next_rung,
            goal=goal,
        )
        pool = SimulatedPool(
            devices,
            clock,
            prices.behaviour,
            ready_after=workers_ready,
            faults=faults,
            tick=tick,
            progress_rates=observe_step_rate,
        )
        assemble(
            settings,
            study,
            pool=pool,
            clock=clock,
            prices=prices,
            n_trials=len(jobs) if n_trials is None else n_trials,
            timeout=timeout,
            batch_size=batch_size or len(devices),
            callbacks=callbacks,
        ).run()
    result = record.result(cluster)
    summary = study.user_attrs.get("saturn:last_sweep", {})
    result.info.update({k: summary[k] for k in ("held_device_seconds", "released") if k in summary})
    return result


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """A simulated sweep logs nothing below a warning (thousands of trials would)."""
    logger = logging.getLogger("optuna")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def _work_units(work_limit: float, time_limit: float | None) -> float:
    """``work_limit``, or the number given under its old name ``time_limit`` (with a warning: it is work units, not
    the seconds ``solve(time_limit=)`` means)."""
    if time_limit is None:
        return work_limit
    warnings.warn(
        "time_limit= of simulate() and run_simulation() is renamed work_limit= (units of planner.WorkLimit, not "
        "seconds); pass work_limit=.",
        FutureWarning,
        stacklevel=3,
    )
    return time_limit


def simulated_devices(cluster: Cluster) -> list[Device]:
    """A device per device of ``cluster``, named by node when there are several."""
    several = len(cluster.nodes) > 1
    return [
        Device("cuda", i, node=f"node{n}" if several else "")
        for n, size in enumerate(cluster.nodes)
        for i in range(size)
    ]


def simulated_strategies(names: Iterable[str]) -> list[Strategy]:
    """The shipped template of each strategy name, or a plain data-parallel one for names the simulation made up
    (its checkpoints reshard, like DDP's)."""
    known = load_strategies()
    return [known.get(name) or Strategy(name, "torchrun", "ddp", min_devices=1) for name in dict.fromkeys(names)]


def _per_job(value: float | Mapping[str, float], name: str) -> float:
    return float(value.get(name, 0.0)) if isinstance(value, Mapping) else float(value)


def _numbered(plan: Plan, jobs: Sequence[SimulatedJob]) -> Plan:
    """``plan`` with its jobs named as the sweep names their trials (their number: the order they are enqueued)."""
    number = {j.job.name: str(i) for i, j in enumerate(jobs)}
    return Plan(tuple(Assignment(number[a.job], a.option, a.node, a.devices, a.start, a.end) for a in plan.assignments))


class _Record(SweepListener):
    """What the simulated sweep did: every run of every trial, and its plans."""

    def __init__(self, clock: VirtualClock, prices: KnownPrices) -> None:
        self._clock, self._prices = clock, prices
        self._started: dict[int, TrialStart] = {}
        self._runs: list[tuple[int, TrialStart, float]] = []
        self._origin = 0.0
        self.plans = self.replaced = 0
        self.first_makespan: float | None = None
        self.wall_seconds = 0.0

    def on_sweep_start(self, study: optuna.Study, devices: Sequence[str], started_at: float) -> None:
        self._origin = started_at

    def on_sweep_end(self, study: optuna.Study, now: float, interrupted: bool) -> None:
        self.wall_seconds = now

    def on_plan(self, study: optuna.Study, plan: Plan, trial_numbers: Sequence[int], now: float) -> None:
        self.plans += 1
        self.replaced += plan.solver not in ("kept",)
        if self.first_makespan is None:
            self.first_makespan = now + plan.makespan

    def on_trial_start(self, study: optuna.Study, start: TrialStart) -> None:
        self._started[start.number] = start

    def on_trial_move(self, study: optuna.Study, move: TrialMove) -> None:
        if move.phase == "stopped":
            self._ran(move.number)

    def on_trial_end(self, study: optuna.Study, trial: FrozenTrial, now: float) -> None:
        self._ran(trial.number)

    def _ran(self, number: int) -> None:
        start = self._started.pop(number, None)
        if start is not None:
            self._runs.append((number, start, self._clock.now() - self._origin))

    def result(self, cluster: Cluster) -> SimulationResult:
        executed = []
        for number, start, end in self._runs:
            job = self._prices.jobs[self._prices.job_index(number)].job
            node, devices = _place(start.devices)
            option = next(o for o in job.options if o.strategy == start.strategy and o.devices == len(devices))
            executed.append(Assignment(job.name, option, node, devices, start.start, end))
        makespan = max((a.end for a in executed), default=0.0)
        work = sum(len(a.devices) * (a.end - a.start) for a in executed)
        utilisation = work / (cluster.total_devices * makespan) if makespan > 0 else 0.0
        moves = len(executed) - len({a.job for a in executed})
        return SimulationResult(
            makespan,
            utilisation,
            tuple(sorted(executed, key=lambda a: (a.start, a.job))),
            self.first_makespan or 0.0,
            self.plans,
            self.replaced,
            info={"resizes": moves, "wall_seconds": self.wall_seconds},
        )


def _place(names: Sequence[str]) -> tuple[int, tuple[int, ...]]:
    """A simulated trial's node and node-local devices, from its devices' names (``node1/cuda:3``: see
    :func:`simulated_devices`)."""
    node = int(names[0].split("/")[0][len("node") :]) if "/" in names[0] else 0
    return node, tuple(int(name.rsplit(":", 1)[1]) for name in names)
