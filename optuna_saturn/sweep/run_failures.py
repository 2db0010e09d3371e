"""How a trial's run failed, as the policies that judge ends read it (faults, asking)."""

from __future__ import annotations

from optuna_saturn.pools.protocol import JobEnd
from optuna_saturn.sweep.state import TrialRun
from optuna_saturn.worker.failures import CRASH, OUT_OF_MEMORY


def failure_kind(run: TrialRun, end: JobEnd) -> str | None:
    """How the trial's run failed (out of memory, mismatch, crash), or None if it did not. The rank that failed
    first says, whichever rank it was: rank 0 may only have seen a peer go away, or never reported at all (it was
    stopped while it waited for that peer in a collective)."""
    outcome = run.session.outcome or {}
    if outcome.get("op") not in ("fail", None) or (outcome.get("op") is None and end.clean):
        return None
    if end.failure is not None:
        return end.failure.kind
    if outcome.get("op") == "fail":
        return str(outcome.get("kind", CRASH))
    return None


def out_of_memory_undescribed(run: TrialRun, end: JobEnd) -> bool:
    """The run ran out of memory although its trial ran undescribed (it had nothing to choose): described, it may
    fit with more micro-batches."""
    return failure_kind(run, end) == OUT_OF_MEMORY and run.waiting.price.workload is None
