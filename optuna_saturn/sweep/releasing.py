"""The releasing policy: which idle devices go back to the cluster, under a deadline or a budget.

There the user pays for device-hours, so a node the sweep will not use again is not held to the end. A node is
given back once the sweep asks for no more trials and the plan of every trial left leaves all its devices idle
(the tail of a sweep, where the last long trials run on some nodes and the others wait). One node of the largest
size the sweep has is always kept: a trial run again after a fault may need it. The pool gives back what it can
(:meth:`~optuna_saturn.pools.protocol.Pool.release`): a Ray cluster whole nodes, one machine nothing. In makespan
mode nothing is given back: idle devices are where elastic moves widen the last trials.
"""

from __future__ import annotations

from optuna_saturn.sweep.decisions import Release
from optuna_saturn.sweep.policy import Decisions, Policy, Round
from optuna_saturn.sweep.state import SweepState


class Releasing(Policy):
    """It keeps no memory: what it offers and the pool does not take (a node with a worker starting, or one
    replaced after a job failed) is offered again at the next round, until the pool takes it."""

    def __init__(self, *, enabled: bool) -> None:
        self._enabled = enabled

    def on_round(self, round: Round) -> Decisions:
        release = self.idle(round.state, asking_done=round.asking_done, profiling=round.profiling)
        return [release] if release is not None else []

    def idle(self, state: SweepState, *, asking_done: bool, profiling: bool) -> Release | None:
        """The devices no trial left will use, once no more trials come and every trial left is planned."""
        if not self._enabled or not asking_done or profiling or state.plan_dirty:
            return None
        if not state.running and not state.waiting:
            return None  # (the sweep ends now: the pool closes)
        if any(w.assignment is None for w in state.waiting.values()):
            return None
        needed = {d for r in state.running.values() for d in r.devices}
        needed |= {d for w in state.waiting.values() if w.assignment for d in w.assignment.devices}
        idle = {d for node in state.topology.members for d in node} - needed
        largest = state.largest_node
        if not any(len(node) == largest and set(node) & needed for node in state.topology.members):
            kept = next(node for node in state.topology.members if len(node) == largest)
            idle -= set(kept)  # (a trial run again may need the largest node)
        return Release(frozenset(idle)) if idle else None
