"""Between fresh plans, the last one followed (see :mod:`~optuna_saturn.sweep.planning`'s docstring): when
hundreds of trials wait, or tens on tens of nodes, each trial keeps its option and its order and takes the devices
that free up first, and new trials join it longest first, until a fresh plan is due."""

from __future__ import annotations

from optuna_saturn.planner import Plan, lower_bound, reflow
from optuna_saturn.sweep.options import FUTURE
from optuna_saturn.sweep.state import SweepState

#: Above this many (waiting trial, node) pairs, a fresh plan costs more than an event leaves time for: the last
#: one is followed between fresh plans ...
REPAIR_ABOVE = 512
#: ... which come once this share of the trials are new, or the followed plan ends this much later.
FRESH_SHARE = 0.1
DRIFT = 0.05
#: A followed plan within this share of its lower bound (no plan can end sooner) is close enough.
CLOSE_ENOUGH = 0.05

#: The last fresh plan: its trials, the sweep's changes then, its end and its length.
Fresh = tuple[set[str], int, float, float]


def followed(
    previous: Plan | None, fresh: Fresh | None, jobs: list, busy: list, state: SweepState, now: float
) -> Plan | None:
    """The previous plan followed, if a fresh one is not due yet; else None."""
    names = {j.name for j in jobs if not j.name.startswith(FUTURE)}
    if previous is None or fresh is None or small(len(names), state):
        return None
    fresh_names, changes, fresh_end, span = fresh
    if changes != state.changes or len(names - fresh_names) >= FRESH_SHARE * len(names):
        return None
    kept = reflow(previous, jobs, state.cluster, busy=busy)
    # the trials that arrived since may end it later by their work spread over the devices, and no more
    arrived = sum(min(o.runtime * o.devices for o in j.options) for j in jobs if j.name in names - fresh_names)
    allowed = fresh_end + arrived / state.cluster.total_devices + DRIFT * span
    if now + kept.makespan <= allowed or kept.makespan <= (1 + CLOSE_ENOUGH) * lower_bound(
        jobs, state.cluster, busy=busy
    ):
        return kept
    return None


def small(waiting: int, state: SweepState) -> bool:
    """Whether a fresh plan of ``waiting`` trials costs little enough to make at every event."""
    return waiting * len(state.cluster.nodes) <= REPAIR_ABOVE
