"""How much of its steps a trial is expected to run under the study's pruner, so that the planner prices trials at
their expected runtime instead of their full length.

Under a pruner most trials stop at an early report, and a planner that prices every trial at its full length
gives devices to trials that will be stopped soon, while holding back the ones that will go on. What a trial is
expected to run is learned from the sweep's own history: each finished trial ran a share of its steps (1 when it
completed, less when it was pruned; ``saturn:steps``), and a trial that has reached a share ``r`` of its steps is
expected to run the mean of what the trials that went past ``r`` ran beyond it. Two rules of the pruner's own
come first, where Optuna's pruners have them: no trial is pruned before the study has ``n_startup_trials``
complete trials (Median and Percentile pruners), so until then every trial is priced whole; and a Hyperband or
successive-halving pruner's first rung is at ``min_resource`` steps. Until several trials have finished, the
estimate is held towards the full length (``PRIOR_TRIALS`` trials that completed are counted in), so a few early
prunes do not make every trial look short.

Pruning-blind planning is this with every share taken as 1: ``Survival(None)``.

Planning to the next rung needs two more things from the same history: where the rungs are (the shares at which
trials were pruned, those at most ``RUNG_WIDTH`` apart taken as one) and a trial's chance of going past its next
one. A trial has passed a rung once it has run that rung's lowest share.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

import optuna
from optuna.trial import FrozenTrial, TrialState

from optuna_saturn.study.records import record

#: Trials that completed, counted in before any is seen: the estimate leaves the full length gradually.
PRIOR_TRIALS = 3.0
#: Trials pruned at shares of their steps at most this far apart were pruned at one rung (report intervals in
#: steps round differently for trials of different lengths).
RUNG_WIDTH = 0.02
#: A trial whose chance of going past its next rung is below this is planned as one the pruner will stop there.
LIKELY_STOPPED = 0.5


class Survival:
    """The shares of their steps that the sweep's finished trials ran, and what a trial is expected to run."""

    def __init__(self, pruner: optuna.pruners.BasePruner | None, *, to_next_rung: bool = False) -> None:
        self._to_next_rung = to_next_rung
        self._blind = pruner is None or isinstance(pruner, optuna.pruners.NopPruner)
        self._startup = int(getattr(pruner, "_n_startup_trials", 0) or 0)
        self._pruner_name = type(pruner).__name__ if pruner is not None else "none"
        self._pruned: list[float] = []  # sorted: the shares at which trials were pruned (completed ones ran 1)
        self._rungs: tuple[int, list[tuple[float, float]]] = (-1, [])  # (version, rungs) of the last look
        self._completed = 0
        self.version = 0

    @classmethod
    def of_study(cls, study: optuna.Study, *, blind: bool = False, to_next_rung: bool = False) -> Survival:
        """Learned from the study's finished trials (an earlier sweep's count too); ``blind``: pruning-blind;
        ``to_next_rung``: trials are planned to their next rung (:meth:`likely_stopped`)."""
        survival = cls(None if blind else study.pruner, to_next_rung=to_next_rung)
        if not survival.blind:  # (blind, it needs no history: a large study is not read for nothing)
            survival.saw_trials(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
        return survival

    @property
    def blind(self) -> bool:
        return self._blind

    def saw_trials(self, trials: Iterable[FrozenTrial]) -> None:
        for trial in trials:
            if trial.state == TrialState.COMPLETE:
                self.saw(1.0, complete=True)
            elif trial.state == TrialState.PRUNED:
                steps = record(trial, "steps")
                if steps and steps[1]:
                    self.saw(steps[0] / steps[1], complete=False)

    def saw_run(self, steps: int, total_steps: int, *, complete: bool) -> bool:
        """A trial ended, having run ``steps`` of its ``total_steps`` (all, if ``complete``); whether what trials are
        expected to run moved by a tenth or more (worth saying)."""
        if self.blind or (not complete and not total_steps):
            return False
        before = self.expected_share()
        self.saw(1.0 if complete else steps / total_steps, complete=complete)
        return abs(self.expected_share() - before) >= 0.1

    def saw(self, share: float, *, complete: bool) -> None:
        """A trial ended, having run ``share`` of its steps."""
        if not complete:
            bisect.insort(self._pruned, min(max(share, 0.0), 1.0))
        self._completed += complete
        self.version += 1

    def expected_share(self, reached: float = 0.0) -> float:
        """The share of its remaining steps that a trial which has run ``reached`` of them is expected to run
        (1: all of them)."""
        if self._blind or self._completed < self._startup:
            return 1.0
        left = 1.0 - reached
        if left <= 0:
            return 1.0
        past = self._pruned[bisect.bisect_right(self._pruned, reached) :]
        ran = sum(share - reached for share in past) + (self._completed + PRIOR_TRIALS) * left
        return min(1.0, ran / (len(past) + self._completed + PRIOR_TRIALS) / left)

    def next_rung(self, reached: float = 0.0) -> float | None:
        """The share of its steps at which a trial which has run ``reached`` of them meets its next rung (None:
        no rung ahead, or the pruner prunes nothing yet)."""
        rung = self._next_rung(reached)
        return rung[0] if rung is not None else None

    def chance_past_next_rung(self, reached: float = 0.0) -> float | None:
        """The chance that a trial which has run ``reached`` of its steps goes past its next rung: of the finished
        trials that got as far (complete, or pruned later), the share that went past the rung (``PRIOR_TRIALS``
        that completed counted in). None: no rung ahead."""
        rung = self._next_rung(reached)
        if rung is None:
            return None
        on = max([reached, *(high for low, high in self._rung_list() if low <= reached)])  # (the rung it is on)
        got_there = len(self._pruned) - bisect.bisect_right(self._pruned, on) + self._completed
        went_past = len(self._pruned) - bisect.bisect_right(self._pruned, rung[1]) + self._completed
        return (went_past + PRIOR_TRIALS) / (got_there + PRIOR_TRIALS)

    def likely_stopped(self, reached: float = 0.0) -> bool:
        """Whether a trial which has run ``reached`` of its steps is planned as one likely pruned at its next rung
        (never unless trials are planned to their next rung)."""
        chance = self.chance_past_next_rung(reached) if self._to_next_rung else None
        return chance is not None and chance < LIKELY_STOPPED

    def _next_rung(self, reached: float) -> tuple[float, float] | None:
        if self._blind or self._completed < self._startup:
            return None
        return next(((low, high) for low, high in self._rung_list() if low > reached), None)

    def _rung_list(self) -> list[tuple[float, float]]:
        """Each rung's lowest and highest share: pruned shares at most ``RUNG_WIDTH`` apart are one rung. A prune
        at the last report (``1 - RUNG_WIDTH`` of the steps or more) makes no rung: stopped there, a trial cost
        what it would have completing."""
        if self._rungs[0] != self.version:
            rungs: list[tuple[float, float]] = []
            for share in (s for s in self._pruned if s < 1 - RUNG_WIDTH):
                if rungs and share - rungs[-1][1] <= RUNG_WIDTH:
                    rungs[-1] = (rungs[-1][0], share)
                else:
                    rungs.append((share, share))
            self._rungs = (self.version, rungs)
        return self._rungs[1]

    def describe(self) -> str:
        """What the pricing assumes, for the log and ``saturn:options``."""
        if self._blind:
            return "priced at their full length (no pruner, or pruning-blind planning)"
        if self._completed < self._startup:
            return (
                f"priced at their full length: the {self._pruner_name} prunes nothing before "
                f"{self._startup} trials complete ({self._completed} have)"
            )
        pruned = len(self._pruned)
        assumed = (
            f"priced at {self.expected_share():.0%} of their steps: {pruned + self._completed} finished trials under "
            f"the {self._pruner_name}, {pruned} pruned"
        )
        rung, chance = self.next_rung(), self.chance_past_next_rung()
        if self._to_next_rung and rung is not None and chance is not None:
            assumed += f"; planned to their next rung, {rung:.0%} of their steps, which {chance:.0%} go past"
            assumed += ", on their most efficient options" if chance < LIKELY_STOPPED else ""
        return assumed
