"""A sweep that really ran, as the simulator's input: what each trial really took, and what the sweep spent beside.

Each trial of the sweep becomes a simulated job: the options it was priced with (``saturn:options``), as the real
sweep saw them; its true runtime under the option it ran (``saturn:actual_runtime``), the others scaled alike;
where it stopped (``saturn:steps``: a pruned trial stops at that share of its steps); its run's start-up before its
first step; and the time describing it took the loop (``saturn:describe_seconds``). The sweep's workers' start
comes from ``saturn:last_sweep``. Simulated with the real loop (:func:`.simulator.run_simulation`),
the replay tells how long those same trials would take on other clusters, and, on the same devices, how far the
simulator is from what really happened.
"""

from __future__ import annotations

from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from optuna_saturn.planner import Cluster, Job, Option
from optuna_saturn.simulation.known_prices import SimulatedJob
from optuna_saturn.simulation.pool import Behaviour
from optuna_saturn.study.records import record, records

ATTR = "saturn:"


@dataclass(frozen=True)
class Replay:
    """What :func:`replay_of` read: the jobs in the order the sweep took them, and what it spent beside them."""

    jobs: list[SimulatedJob]
    devices: int  # the sweep's pool
    workers_ready: list[float]  # per device, seconds after the start that its worker was first ready
    known_ahead: bool  # the trials were enqueued (known before they were asked), not sampled one by one
    wall_seconds: float  # what the sweep took, as recorded

    def cluster(self) -> Cluster:
        return Cluster([self.devices])

    @property
    def typical_ready(self) -> float:
        """When a worker was ready, the median over the devices: what a pool of another size is given."""
        return sorted(self.workers_ready)[len(self.workers_ready) // 2]


def replay_of(study: optuna.Study, *, sweep: int = -1, observed: bool = True) -> Replay:
    """The study's sweep number ``sweep`` (as a list index: -1, the latest) as simulated jobs; ``observed=False``
    makes every trial take what it was priced."""
    trials = [t for t in study.get_trials(deepcopy=False) if isinstance(record(t, "actual_start"), (int, float))]
    if not trials:
        raise ValueError(
            f"No trial of study {study.study_name!r} recorded a run (saturn:actual_start); run a sweep "
            "with `optuna-saturn run` or SaturnExecutor first."
        )
    sweeps = sorted({record(t, "sweep_started_at", 0.0) for t in trials})
    if not -len(sweeps) <= sweep < len(sweeps):
        raise ValueError(f"Study {study.study_name!r} recorded {len(sweeps)} sweep(s); there is no sweep {sweep}.")
    started = sweeps[sweep]
    trials = sorted((t for t in trials if record(t, "sweep_started_at", 0.0) == started), key=lambda t: t.number)
    summary = study.user_attrs.get(ATTR + "last_sweep") or {}
    if summary.get("started_at") != started:  # (an earlier sweep: its own summary was overwritten)
        summary = {}
    # (one trial per pool records it: the latest that did)
    pool: list[str] = next((record(t, "pool") for t in reversed(trials) if record(t, "pool")), [])
    ready = [float(v) for v in (summary.get("workers_ready") or {}).values()]
    index = {t.number: i for i, t in enumerate(trials)}
    return Replay(
        jobs=[_job(t, observed, index) for t in trials],
        devices=len(pool) or max(d for t in trials for d in record(t, "device_ids", [0])) + 1,
        workers_ready=ready or [0.0],
        known_ahead=all("fixed_params" in t.system_attrs for t in trials),
        # (an earlier sweep's own summary was overwritten: its last trial's end stands for its wall clock)
        wall_seconds=summary.get("wall_seconds") or max(record(t, "actual_end") for t in trials),
    )


def _job(trial: FrozenTrial, observed: bool, index: dict[int, int]) -> SimulatedJob:
    attrs = records(trial)
    options = [Option.from_json(o) for o in attrs.get("options") or []]
    history = attrs.get("prices") or []  # its price as first given, then after each run that changed it
    first = [Option.from_json(o) for o in history[0][1]] if history else options
    changes = tuple(
        (index.get(taught, -1) if taught is not None else -1, tuple(Option.from_json(o) for o in opts))
        for taught, opts in history[1:]
    )
    chosen = (attrs["strategy"], int(attrs["num_devices"]), int(attrs.get("gradient_accumulation", 1)))
    if not any(o.choice == chosen for o in options):  # (priced again after it started: its run is the truth)
        options.append(Option(*chosen[:2], float(attrs.get("planned_runtime", attrs["actual_runtime"])), chosen[2]))
    estimate = next(o.runtime for o in options if o.choice == chosen)
    step, total = attrs.get("steps") or (100, 100)
    total = max(int(total), 1)
    share = min(max(int(step), 0) / total, 1.0) if trial.state != TrialState.COMPLETE else 1.0
    runtime = float(attrs["actual_runtime"])
    startup = 0.0
    if isinstance(attrs.get("first_step"), (int, float)) and attrs.get("step_seconds"):
        startup = max(0.0, attrs["first_step"] - attrs["actual_start"] - attrs["step_seconds"])
    full = startup + (runtime - startup) / share if 0 < share < 1 else runtime  # had it run to its end
    scale = full / estimate if observed and estimate > 0 else 1.0
    every = {o.choice: o for priced in (first, *(c for _, c in changes), options) for o in priced}
    truth = {choice: max(o.runtime * scale, startup) for choice, o in every.items()}
    if observed:
        truth[chosen] = full
    return SimulatedJob(
        Job(str(trial.number), first),
        Behaviour(
            truth,
            steps=total,
            prune_at=share if observed else 1.0,
            startup=startup,
            values=tuple(trial.values or (0.0,)),
        ),
        measured=attrs.get("priced_by", "measured") == "measured",
        uncertainty=0.0 if attrs.get("priced_by", "measured") == "measured" else 0.3,
        describe_seconds=float(attrs.get("describe_seconds") or 0.0),
        prices=changes,
    )
