"""Grouping the options to measure into profiling jobs: one job per device count and micro-batch count (one-process
strategies apart), each timing several trials' strategies in turn, least memory first (an out-of-memory run stops
the job before what would need even more). A job's set-up is paid once for all it times."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import optuna

from optuna_saturn.pricing.prices import ProfileEntry, ProfileJob
from optuna_saturn.profiler import Workload, model_state_bytes
from optuna_saturn.strategy import Strategy


@dataclass(frozen=True)
class Wanted:
    """One option of one trial to measure: its strategy on ``devices`` devices with ``accumulation`` micro-batches,
    stored under ``key``."""

    trial: optuna.Trial | optuna.trial.FixedTrial  # (a FixedTrial: one still in the study's queue)
    workload: Workload
    strategy: Strategy
    key: str
    devices: int
    accumulation: int


def grouped_into_jobs(wanted: Sequence[Wanted]) -> list[ProfileJob]:
    """The jobs that measure ``wanted``, the widest first."""
    groups: dict[tuple[int, int, bool], dict[int, list[Wanted]]] = {}
    for want in wanted:
        # a one-process strategy runs without its peers' process group: never in the same job as those
        group = groups.setdefault((want.devices, want.accumulation, want.strategy.one_process), {})
        group.setdefault(want.trial.number, []).append(want)
    jobs = []
    for (devices, accumulation, _), by_trial in groups.items():
        entries = []
        for members in by_trial.values():
            workload = members[0].workload
            members.sort(
                key=lambda m: model_state_bytes(
                    workload.n_params,
                    workload.bytes_per_param,
                    m.strategy,
                    devices,
                    optimizer_states=workload.optimizer_states,
                )
            )
            strategies, keys = tuple(m.strategy for m in members), tuple(m.key for m in members)
            entries.append(ProfileEntry(members[0].trial, workload, strategies, keys))
        jobs.append(ProfileJob(tuple(entries), devices, accumulation))
    return sorted(jobs, key=lambda j: (-j.devices, j.name))
