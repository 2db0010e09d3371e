"""What a sweep recorded, read back from a study: who ran where and when, against the plan.

Why a model of its own: the chart, the text summary, the dashboard note and the ``plan``/``simulate`` commands all
read the same ``saturn:*`` user attributes. Reading them once, here, keeps the attribute names in one place and
lets a live listener add trials that have not finished yet (their attributes are only written at the end).

Times are seconds since the start of the sweep a trial belongs to (a study may hold several sweeps, one per
``optimize`` call; ``saturn:sweep_started_at`` tells them apart).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from optuna_saturn.planner import Cluster, Job, Option, lower_bound
from optuna_saturn.study.records import record, records

ATTR = "saturn:"
WAITING = "WAITING"  # planned, not started yet (a live state; Optuna calls such a trial RUNNING)


@dataclass(frozen=True)
class ProfilingRun:
    """A profiling launch made for a trial: which options it timed, on which devices, when."""

    option: str
    devices: tuple[str, ...]
    start: float
    end: float


@dataclass(frozen=True)
class RecordedRun:
    """One trial of a sweep: its chosen strategy and devices, its planned and actual times, and its outcome."""

    number: int
    state: str  # an Optuna TrialState name, or WAITING
    strategy: str | None = None
    devices: tuple[str, ...] = ()
    planned_start: float | None = None
    planned_end: float | None = None
    actual_start: float | None = None
    actual_end: float | None = None
    options: tuple[Option, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)
    values: tuple[float, ...] | None = None
    fail_reason: str | None = None
    profiling: tuple[ProfilingRun, ...] = ()

    @property
    def ran(self) -> bool:
        """Whether the trial was launched (it has an actual start)."""
        return self.actual_start is not None

    @property
    def actual_runtime(self) -> float | None:
        if self.actual_start is None or self.actual_end is None:
            return None
        return self.actual_end - self.actual_start

    @property
    def planned_runtime(self) -> float | None:
        if self.planned_start is None or self.planned_end is None:
            return None
        return self.planned_end - self.planned_start


@dataclass(frozen=True)
class SweepRecord:
    """The trials of one sweep (one ``optimize`` call) and the device pool they ran on.

    ``pool`` is exact when a live listener was told the devices or a trial recorded ``saturn:pool``; otherwise it
    is inferred as devices ``0..max used`` of the kind used (``pool_inferred``), which can be smaller than the
    real pool.
    """

    started_at: float  # epoch seconds
    runs: tuple[RecordedRun, ...]
    pool: tuple[str, ...]
    pool_inferred: bool = False

    @property
    def devices_used(self) -> tuple[str, ...]:
        return tuple(sorted({d for r in self.runs for d in r.devices}, key=device_sort_key))

    @property
    def makespan(self) -> float:
        """When the last launched trial ended (or, while it runs, the latest end seen so far)."""
        return max((r.actual_end for r in self.runs if r.actual_end is not None), default=0.0)

    @property
    def planned_makespan(self) -> float:
        return max((r.planned_end for r in self.runs if r.planned_end is not None), default=0.0)

    def jobs(self, *, observed: bool = True) -> list[Job]:
        """Planner jobs for every trial with recorded options; see :func:`jobs_from_runs` for ``observed``."""
        return jobs_from_runs(self.runs, observed=observed)

    def lower_bound(self) -> float | None:
        """A lower bound on any plan's makespan for these trials on this pool, with observed runtimes.

        The estimates a batch was planned with can be far off (the first batch is priced by a prior), so a bound
        on them says little about the sweep that really ran; rescaled by what each trial really took, the bound
        answers "how much faster could any plan have run these very trials".
        """
        jobs = self.jobs(observed=True)
        if not jobs or not self.pool:
            return None
        try:
            return lower_bound(jobs, Cluster([len(self.pool)]))
        except ValueError:  # an inferred pool too small for some trial's every option: no bound to claim
            return None

    def utilisation(self) -> float | None:
        """Busy device-seconds over pool size x makespan: the share of the pool's time that trials used."""
        busy = sum((r.actual_runtime or 0.0) * len(r.devices) for r in self.runs if r.ran)
        return self._share(busy)

    def profiling_share(self) -> float | None:
        """The share of the pool's time over the makespan that profiling launches held devices."""
        return self._share(sum((p.end - p.start) * len(p.devices) for r in self.runs for p in r.profiling))

    def _share(self, device_seconds: float) -> float | None:
        span = self.makespan
        if span <= 0 or not self.pool:
            return None
        return device_seconds / (span * len(self.pool))


def device_sort_key(label: str) -> tuple[str, int, str]:
    """Order ``cuda:2`` before ``cuda:10`` (natural order of the device index)."""
    match = re.fullmatch(r"(\w+):(\d+)", label)
    return (match.group(1), int(match.group(2)), "") if match else (label, -1, label)


def run_from_trial(trial: FrozenTrial) -> RecordedRun:
    """Read one trial's ``saturn:*`` records (:mod:`optuna_saturn.study.records`)."""
    attrs = {ATTR + k: v for k, v in records(trial).items()}

    def number(key: str) -> float | None:
        value = attrs.get(ATTR + key)
        return float(value) if isinstance(value, (int, float)) else None

    options = tuple(Option.from_json(o) for o in attrs.get(ATTR + "options", ()) or () if isinstance(o, Mapping))
    return RecordedRun(
        number=trial.number,
        state=trial.state.name,
        strategy=attrs.get(ATTR + "strategy"),
        devices=tuple(str(d) for d in attrs.get(ATTR + "devices", ()) or ()),
        planned_start=number("planned_start"),
        planned_end=number("planned_end"),
        actual_start=number("actual_start"),
        actual_end=number("actual_end"),
        options=options,
        params=dict(trial.params),
        values=tuple(trial.values) if trial.values is not None else None,
        fail_reason=attrs.get(ATTR + "fail_reason"),
        profiling=tuple(
            ProfilingRun(str(p["option"]), tuple(str(d) for d in p["devices"]), float(p["start"]), float(p["end"]))
            for p in attrs.get(ATTR + "profiling", ()) or ()
            if isinstance(p, Mapping)
        ),
    )


def read_sweeps(
    trials: Iterable[FrozenTrial],
    *,
    live: Sequence[RecordedRun] = (),
    live_started_at: float | None = None,
    pool: Sequence[str] | None = None,
) -> list[SweepRecord]:
    """Group a study's saturn trials by sweep, oldest first.

    ``live`` runs (trials a listener knows are waiting or running) replace the stored record of the same trial
    number and belong to the sweep that started at ``live_started_at``, whose pool is ``pool`` when given.
    """
    by_sweep: dict[float, dict[int, RecordedRun]] = {}
    recorded_pools: dict[float, tuple[str, ...]] = {}  # from `saturn:pool`, where the sweep records it
    for trial in trials:
        started = record(trial, "sweep_started_at")
        if isinstance(started, (int, float)):
            by_sweep.setdefault(float(started), {})[trial.number] = run_from_trial(trial)
            if record(trial, "pool"):
                recorded_pools[float(started)] = tuple(str(d) for d in record(trial, "pool"))
    if live_started_at is not None:
        sweep = by_sweep.setdefault(float(live_started_at), {})
        for run in live:
            sweep[run.number] = run
    records = []
    for started, runs in sorted(by_sweep.items()):
        ordered = tuple(runs[n] for n in sorted(runs))
        known = tuple(pool) if pool is not None and started == live_started_at else recorded_pools.get(started)
        records.append(
            SweepRecord(started_at=started, runs=ordered, pool=known or infer_pool(ordered), pool_inferred=not known)
        )
    return records


def read_study(study: optuna.Study) -> list[SweepRecord]:
    """Every sweep recorded in ``study``, oldest first."""
    return read_sweeps(study.get_trials(deepcopy=False))


def infer_pool(runs: Iterable[RecordedRun]) -> tuple[str, ...]:
    """Devices ``kind:0 .. kind:max`` for the kind(s) the runs (and their profiling launches) used: the smallest
    pool consistent with them."""
    highest: dict[str, int] = {}
    others: set[str] = set()
    for run in runs:
        for label in (*run.devices, *(d for p in run.profiling for d in p.devices)):
            kind, index, _ = device_sort_key(label)
            if index < 0:
                others.add(label)
            else:
                highest[kind] = max(highest.get(kind, -1), index)
    labels = [f"{kind}:{i}" for kind, top in highest.items() for i in range(top + 1)]
    return tuple(sorted(labels + sorted(others), key=device_sort_key))


def jobs_from_runs(runs: Iterable[RecordedRun], *, observed: bool = False) -> list[Job]:
    """Planner jobs from the options each trial recorded (``saturn:options``).

    With ``observed``, every option of a trial that ran is rescaled by that trial's actual / planned runtime, so
    that a what-if plan uses what really happened (a slow or pruned trial stays slow or short) rather than the
    estimates the sweep planned with.
    """
    jobs = []
    for run in runs:
        if not run.options:
            continue
        scale = 1.0
        if observed and run.actual_runtime is not None and run.planned_runtime and run.planned_runtime > 0:
            scale = run.actual_runtime / run.planned_runtime
        jobs.append(Job(str(run.number), [replace(o, runtime=o.runtime * scale) for o in run.options]))
    return jobs
