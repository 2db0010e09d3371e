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
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

import optuna
from optuna.trial import FrozenTrial, TrialState

#: Trials that completed, counted in before any is seen: the estimate leaves the full length gradually.
PRIOR_TRIALS = 3.0


class Survival:
    """The shares of their steps that the sweep's finished trials ran, and what a trial is expected to run."""

    def __init__(self, pruner: optuna.pruners.BasePruner | None) -> None:
        self._blind = pruner is None or isinstance(pruner, optuna.pruners.NopPruner)
        self._startup = int(getattr(pruner, "_n_startup_trials", 0) or 0)
        self._pruner_name = type(pruner).__name__ if pruner is not None else "none"
        self._shares: list[float] = []  # sorted
        self._completed = 0
        self.version = 0

    @classmethod
    def of_study(cls, study: optuna.Study, *, blind: bool = False) -> Survival:
        """Learned from the study's finished trials (an earlier sweep's count too); ``blind``: pruning-blind."""
        survival = cls(None if blind else study.pruner)
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
                steps = trial.user_attrs.get("saturn:steps")
                if steps and steps[1]:
                    self.saw(steps[0] / steps[1], complete=False)

    def saw(self, share: float, *, complete: bool) -> None:
        """A trial ended, having run ``share`` of its steps."""
        bisect.insort(self._shares, min(max(share, 0.0), 1.0))
        self._completed += complete
        self.version += 1

    def expected_share(self, reached: float = 0.0) -> float:
        """The share of its remaining steps that a trial which has run ``reached`` of them is expected to run
        (1: all of them)."""
        if self._blind or self._completed < self._startup:
            return 1.0
        past = self._shares[bisect.bisect_right(self._shares, reached) :]
        left = 1.0 - reached
        if left <= 0:
            return 1.0
        ran = sum(share - reached for share in past) + PRIOR_TRIALS * left
        return min(1.0, ran / (len(past) + PRIOR_TRIALS) / left)

    def describe(self) -> str:
        """What the pricing assumes, for the log and ``saturn:options``."""
        if self._blind:
            return "priced at their full length (no pruner, or pruning-blind planning)"
        if self._completed < self._startup:
            return (
                f"priced at their full length: the {self._pruner_name} prunes nothing before "
                f"{self._startup} trials complete ({self._completed} have)"
            )
        pruned = len(self._shares) - self._completed
        return (
            f"priced at {self.expected_share():.0%} of their steps: {len(self._shares)} finished trials under "
            f"the {self._pruner_name}, {pruned} pruned"
        )
