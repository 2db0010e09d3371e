"""What one profiling run measured of an option, as that option's profile, and what a profile means on devices of
a given memory (pure: no store, no pricing)."""

from __future__ import annotations

import dataclasses
from typing import Any, overload

from optuna_saturn.profiler import ProfileRecord

#: A profile whose peak memory is past this share of its device's is near capacity: an evaluation pass, a checkpoint
#: or fragmentation may make it run out of memory later (it is still planned; its summary says so).
NEAR_CAPACITY = 0.95


def record_of(outcome: dict[str, Any], common: dict[str, Any], *, overhead: float) -> ProfileRecord:
    """The profile of one (trial, strategy) of a profiling job, from rank 0's report (``outcome``): a crash or a
    refusal of the trial's code (``failed``), an out-of-memory (infeasible; more micro-batches may fit if it came
    in the steps), or the timed steps with the run's peak memory. ``overhead``: the job's start-up before the
    objective began."""
    if outcome.get("failed"):
        return ProfileRecord(**common, feasible=False, failed=True, error=outcome.get("error", "failed"))
    if outcome.get("infeasible"):
        return ProfileRecord(
            **common,
            feasible=False,
            more_micro_batches_may_fit=bool(outcome.get("oom_in_steps")),
            error=outcome.get("error", "out of memory"),
        )
    peak = int(outcome.get("peak_memory_bytes") or 0)
    steps = sorted(outcome["step_seconds"])
    reserved = int(outcome.get("reserved_memory_bytes") or 0)
    return ProfileRecord(
        **common,
        feasible=True,
        step_seconds=steps[len(steps) // 2],
        startup_seconds=overhead + outcome["first_step_at"] - outcome["objective_started_at"],
        tail_seconds=outcome.get("tail_seconds"),
        exit_seconds=0.0,
        peak_memory_bytes=peak,
        reserved_memory_bytes=reserved or None,
        step_spread=outcome.get("step_spread"),
        timed_steps=len(steps),
        loop_steps=list(outcome.get("loop_steps") or []),
        between_seconds=outcome.get("between_seconds"),
    )


@overload
def within(record: ProfileRecord, capacity: float) -> ProfileRecord: ...
@overload
def within(record: ProfileRecord | None, capacity: float) -> ProfileRecord | None: ...
def within(record: ProfileRecord | None, capacity: float) -> ProfileRecord | None:
    """``record`` as it stands on devices of ``capacity`` bytes: a run that held more is infeasible there (on a GPU
    it would have run out of memory; a CPU device's capacity, ``device_memory=``, is a budget nothing enforces
    while a run goes on), and more micro-batches may fit; one that held nearly as much is near capacity. The
    stored profile itself stays as measured: the same run fits a larger device."""
    if record is None or not record.feasible or not record.peak_memory_bytes:
        return record
    peak = max(record.peak_memory_bytes, record.reserved_memory_bytes or 0)
    if record.peak_memory_bytes > capacity:
        return dataclasses.replace(
            record,
            feasible=False,
            more_micro_batches_may_fit=True,
            error=f"its peak memory, {record.peak_memory_bytes / 2**20:.0f} MiB, exceeds the device's "
            f"{capacity / 2**20:.0f} MiB",
        )
    if peak > NEAR_CAPACITY * capacity:
        return dataclasses.replace(record, near_capacity=True)
    return record
