"""How long a trial may take to its first step (issue 47, N11), beside the faults policy's stall limit.

A run that never takes its first step (a download that hangs, a lock never freed, a deadlocked rendezvous) would
hold its devices for as long as it waits. Before its first step there is no step time to judge a stall by, and a
start-up may legitimately be long (a DeepSpeed op build, a big model load), so the start-up limit is the stall
limit (its floor: at least :data:`~optuna_saturn.sweep.faults.MIN_STALL_SECONDS`, or ``stall_timeout=``) plus the
start-up's share of the run's planned runtime (:data:`STARTUP_SHARE`), plus twice its last set-ups where it moved.
"""

from __future__ import annotations

import math

from optuna_saturn.sweep.state import TrialRun

#: The share of a run's planned runtime its start-up may take beyond the stall limit: a whole run's, since one
#: that resumes near its end still sets up in full.
STARTUP_SHARE = 1.0


def startup_limit(run: TrialRun, stall_limit: float) -> float:
    """Seconds ``run`` may take to its first step (see the module's docstring)."""
    option = run.assignment.option
    priced = run.waiting.price.option(option.choice)
    planned = max(option.runtime, priced.option.runtime if priced is not None else 0.0)
    share = STARTUP_SHARE * planned if math.isfinite(planned) else 0.0  # (no runtime known: the floor alone)
    setups = [m["setup"] for m in run.waiting.moves if m.get("setup") is not None]
    return stall_limit + share + 2 * max(setups, default=0.0)  # (a moved run sets up again, loads its checkpoint)


def stall_reason(run: TrialRun, silent: float, limit: float) -> str:
    """Why ``run`` is stopped: no progress after a step, or no first step at all (then how to give a long start-up
    more time)."""
    if run.session.last_progress_at is not None:
        return f"its ranks reported no progress for {silent:.0f} s (the limit is {limit:.0f} s)"
    return (
        f"it took no first step in {silent:.0f} s (the start-up limit is {limit:.0f} s: the stall limit plus its "
        "planned runtime); if its start-up (an op build, a big model load) really takes this long, pass a larger "
        "stall_timeout=, which raises the start-up limit as much (docs/failures.md)"
    )
