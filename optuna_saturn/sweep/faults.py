"""The faults policy: a rank that hangs or dies, an option that cannot run a trial, a node lost or joined.

- **Stalls.** A trial whose steps stopped moving for longer than its stall limit (at least two minutes, half its
  planned runtime and fifty of its steps), or that took no first step within its start-up limit (that plus a whole
  run's planned runtime and, for a moved one, twice its last run's set-up: :mod:`~optuna_saturn.sweep.startup`), has a
  rank that hangs (a deadlocked collective or rendezvous, a stuck data loader) or died where its peers wait: it
  is stopped. Its evaluation between steps must fit in the limit. So is a trial that another sweep ended,
  taking this one for dead (a pause, a lost connection): the other runs it again, and its devices free at once.
  A DeepSpeed op build on the machine (a ZeRO sweep's) is no stall: the silence counts from its end.
- **A rank's death** (or a stall) is not the trial's fault: the trial ends FAIL with the reason and its params run
  again as a new trial (``max_retries`` times at most), from its checkpoint if it saved one.
- **An option's fault.** A trial that ran out of memory, refused the trial's code (``StrategyMismatch``), or
  crashed before its first step under an option nobody had run for its workload, is planned again on its other
  options; that option is never planned for the workload again in this sweep. At most ``MAX_ATTEMPTS`` runs.
- **Nodes.** A node that dies takes its devices with it: the plan stops counting on them, and a waiting trial
  no node left can hold fails (or stays in the study's queue). A node that joins is planned on from the next plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import optuna

from optuna_saturn.pools.deepspeed_ops import seconds_since_a_build
from optuna_saturn.pools.protocol import JobEnd
from optuna_saturn.pricing.prices import TrialPrice
from optuna_saturn.sweep.decisions import Describe, Fail, LeaveOut, Readmit, Stop
from optuna_saturn.sweep.policy import Decisions, Ending, Policy, Round, Steps
from optuna_saturn.sweep.run_failures import failure_kind, out_of_memory_undescribed
from optuna_saturn.sweep.settings import SweepSettings
from optuna_saturn.sweep.startup import stall_reason, startup_limit
from optuna_saturn.sweep.state import SweepState, TrialRun
from optuna_saturn.worker.failures import CRASH, MISMATCH, OUT_OF_MEMORY, PEER_GONE

_logger = optuna.logging.get_logger("optuna.saturn")

#: A trial whose first runs of options fail is planned again on other options this many times in all.
MAX_ATTEMPTS = 3
#: The least time a trial's steps may stop moving before it is taken for hung.
MIN_STALL_SECONDS = 120.0


class Faults(Policy):
    """What a fault means for a trial: stop it, leave its option out, run it again, or fail it. It keeps no memory."""

    def __init__(
        self,
        *,
        stall_timeout: float | None,
        max_retries: int,
        may_leave_out: bool,
        taken_over: Callable[[], set[int]] = set,
        since_build: Callable[[], float] = lambda: math.inf,
    ) -> None:
        self._stall_timeout = stall_timeout
        self._taken_over = taken_over  # the held trials another sweep ended (the heartbeat notes them)
        self._since_build = since_build  # since a DeepSpeed op build on this machine ended (0: under way)
        self.max_retries = max_retries
        self._may_leave_out = may_leave_out  # a pricer knows the trials' workloads, to leave options out for

    @classmethod
    def for_sweep(cls, settings: SweepSettings, *, may_leave_out: bool, taken_over: Callable[[], set[int]]) -> Faults:
        return cls(
            stall_timeout=settings.stall_timeout,
            max_retries=settings.max_retries,
            may_leave_out=may_leave_out,
            taken_over=taken_over,
            # (a real sweep's ZeRO trials may build an op, or wait for another's build; a simulated one's never)
            since_build=seconds_since_a_build
            if settings.plan_work is None and any(s.engine_traits.builds_ops for s in settings.strategies)
            else lambda: math.inf,
        )

    def on_end(self, ending: Ending) -> Steps:
        """A run that failed: described late, its option left out (the trial waits for another), or run again."""
        run, end = ending.trial_run, ending.end
        if run is None or ending.reason:
            return
        describe = self.describe_late(run, end)
        if describe is not None:
            yield describe
        left = self.left_out(run, end)
        readmit = self.after_leaving_out(left, (yield left)) if left is not None else None
        if readmit is not None:
            yield readmit
            ending.settle(taught=True)  # an option left out for its workload: the prices changed
            return
        ending.run_again = self.run_again(run, end)

    def on_nodes_lost(self, state: SweepState) -> Decisions:
        return self.without_a_node(state)

    def on_round(self, round: Round) -> Decisions:
        return self.stalled(round.state, round.now)

    def stalled(self, state: SweepState, now: float) -> list[Stop]:
        """Running trials to stop: their ranks stopped moving (see the module's docstring)."""
        stops = []
        taken_over = self._taken_over()
        for run in state.trial_runs():
            if run.stalled:
                continue
            if run.session.taken_over or run.number in taken_over:
                stops.append(Stop(run, "another sweep ended its trial, taking this one for dead; it runs it again"))
                continue
            limit = self.stall_limit(run)
            if run.session.last_progress_at is None:  # not one step yet: it is still starting (sweep/startup.py)
                silent, limit = now - run.started, startup_limit(run, limit)
            else:
                silent = now - (run.session.last_progress_at - state.started_at)
            if silent > limit and min(silent, self._since_build()) > limit:  # (an op build is no stall)
                stops.append(Stop(run, stall_reason(run, silent, limit)))
        return stops

    def stall_limit(self, run: TrialRun) -> float:
        if self._stall_timeout is not None:
            return self._stall_timeout
        step = run.session.step_seconds or 0.0
        return max(MIN_STALL_SECONDS, 0.5 * run.assignment.option.runtime, 50 * step)

    def left_out(self, run: TrialRun, end: JobEnd) -> LeaveOut | None:
        """Whether the trial's option, not the trial, is likely at fault for its failure (see the module's
        docstring): then the option is left out and the trial planned again."""
        kind = failure_kind(run, end)
        if kind is None or not self._may_leave_out:
            return None
        waiting, option = run.waiting, run.assignment.option
        priced = waiting.price.option(option.choice)
        reported = (run.session.outcome or {}).get("op") == "fail"  # (a silent death is the rank's, not the option's)
        first_run_crash = (
            reported and kind == CRASH and (priced is None or not priced.measured) and run.session.step == 0
        )
        if (
            waiting.price.workload is None
            or waiting.attempts >= MAX_ATTEMPTS
            or not (kind in (OUT_OF_MEMORY, MISMATCH) or first_run_crash)
        ):
            return None
        error = end.error or (run.session.outcome or {}).get("error", "failed")
        return LeaveOut(run, error, kind == OUT_OF_MEMORY)

    def describe_late(self, run: TrialRun, end: JobEnd) -> Describe | None:
        """A trial that ran undescribed (nothing to choose) ran out of memory: describe it, for more micro-batches."""
        if not out_of_memory_undescribed(run, end):
            return None
        return Describe(run) if self._may_leave_out else None

    @staticmethod
    def after_leaving_out(left: LeaveOut, price: TrialPrice) -> Readmit | None:
        """The trial waits for another option, if one is left (else it fails)."""
        if not price.options:
            return None
        waiting = left.run.waiting
        return Readmit(
            replace(waiting, price=price, assignment=None, attempts=waiting.attempts + 1),
            f"failed under {left.run.assignment.option.label}, the first run of that option for its workload "
            f"({left.error}); the option is left out",
        )

    def run_again(self, run: TrialRun, end: JobEnd) -> bool:
        """Whether the trial runs again: a rank died or hung, or the storage stayed down while the run asked the
        trial something, not the trial's code (nor its option: a trial that ran out of memory is never run again
        on the same one), and it ran fewer than ``max_retries`` + 1 times."""
        silent = (run.session.outcome or {}).get("op") is None and not end.clean
        faulted = bool(run.stalled) or run.session.storage_failed  # (the storage's fault: a long outage)
        kind = failure_kind(run, end)
        faulted = faulted or (silent and kind not in (OUT_OF_MEMORY, MISMATCH))
        # a rank that said nothing died, and the ones that said only lost it (rank 0 may say so first)
        faulted = faulted or (not end.clean and kind == PEER_GONE)
        if faulted and run.waiting.retries >= self.max_retries:
            _logger.warning(f"Trial {run.number} is not run again: it ran {self.max_retries + 1} times.")
            return False
        return faulted

    def without_a_node(self, state: SweepState) -> list[Fail]:
        """Waiting trials that no node left can hold, once nodes were lost."""
        largest = state.largest_node
        return [
            Fail(
                w,
                f"no option of it fits the nodes left (the largest has {largest} device(s)) once "
                f"{len(state.lost)} device(s) were lost with their node",
            )
            for w in state.waiting.values()
            if not any(p.option.devices <= largest for p in w.price.options)
        ]
