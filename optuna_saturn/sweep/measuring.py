"""How long measuring takes: a profiling job's predicted length (the loop holds its devices for it) and one
option's measurement (what the profiling policy weighs against what the measurement may save); and what a
profiling job measured, as the rank that failed first tells it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from optuna_saturn.pools.protocol import JobEnd
from optuna_saturn.pricing.prices import PricedOption
from optuna_saturn.sweep.state import ProfileRun, SweepState, Waiting
from optuna_saturn.worker.failures import OUT_OF_MEMORY

#: Seconds a measurement of one option spends beyond its steps: starting it on its devices.
SETUP_SECONDS = 1.0
#: A profiling job's option whose trial no longer waits (it started meanwhile) is taken to be this long.
UNKNOWN_RUNTIME = 10.0


class MeasuringTimes:
    """``profile_steps``: the warm-up and timed steps of a measurement."""

    def __init__(self, profile_steps: tuple[int, int]) -> None:
        self._profile_steps = profile_steps

    def profile_seconds(self, run: ProfileRun, state: SweepState) -> float:
        """A profiling job's predicted length: per trial and strategy, its set-up and warm-up and timed steps."""
        total = 0.0
        for entry in run.job.entries:
            waiting = state.waiting.get(entry.trial.number)
            for strategy in entry.strategies:
                choice = (strategy.name, run.job.devices, run.job.gradient_accumulation)
                priced = waiting.price.option(choice) if waiting is not None else None
                runtime = priced.option.runtime if priced is not None else UNKNOWN_RUNTIME
                total += self._seconds(runtime, entry.workload.total_steps)
        return total

    def measurement_seconds(self, waiting: Waiting, priced: PricedOption) -> float:
        """How long measuring one option of a waiting trial takes: its set-up and its warm-up and timed steps."""
        workload = waiting.price.workload
        return self._seconds(priced.option.runtime, workload.total_steps if workload is not None else 1)

    def _seconds(self, runtime: float, total_steps: int) -> float:
        """An option of ``runtime`` for ``total_steps`` steps, measured over the profile's steps."""
        return runtime / max(total_steps, 1) * sum(self._profile_steps) + SETUP_SECONDS


def profile_results(
    results: dict[int, list[dict]], end: JobEnd, log: Path, expected: int
) -> tuple[dict[int, list[dict]], dict[str, Any] | None]:
    """What a profiling job measured, by trial, as the rank that failed first tells it: rank 0 reports each
    strategy, but when a peer ran out of memory first, rank 0 saw only that peer go away (a crash), or never
    reported at all (it was stopped while it waited for the peer in a collective). Returns the results, with
    such a crash report replaced by the out-of-memory, and the outcome of the strategy the job ended in without
    rank 0's word, if any (its trial and strategy, where the failure names them; else the first unreported)."""
    failure = end.failure
    said: dict[str, Any] | None = None
    if failure is not None and failure.kind == OUT_OF_MEMORY:
        said = {"infeasible": True, "oom_in_steps": failure.in_steps, "error": str(failure)[:500]}
    if said is not None and failure is not None and failure.strategy:
        by_trial = results.get(failure.trial) if failure.trial is not None else None
        for outcomes in [by_trial] if by_trial is not None else results.values():
            for i, outcome in enumerate(outcomes):
                if outcome.get("strategy") == failure.strategy and outcome.get("failed"):
                    outcomes[i] = {**said, "strategy": failure.strategy}
                    return results, None
    reported = sum(len(v) for v in results.values())
    ended_early = any(r.get("infeasible") or r.get("stop_launch") for rs in results.values() for r in rs)
    if end.clean or ended_early or reported >= expected:
        return results, None
    outcome = said or {"failed": True, "error": end.error or f"the profiling job ended ({end.reason}) (log: {log})"}
    named = failure if failure is not None and failure.strategy else None
    return results, {**outcome, "strategy": named.strategy if named else None, "trial": named.trial if named else None}
