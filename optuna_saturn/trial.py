"""The ``trial`` that a launched objective receives: an Optuna trial relayed to the parent, plus the helpers a
distributed training loop needs.

Every rank calls the same trial methods in the same order. Rank 0 asks the executor, which calls the real
``optuna.Trial`` (so the study's own sampler and pruner decide); the answer is broadcast so all ranks see the same
hyperparameters and the same pruning decision. A pruned trial therefore stops on every rank at the same step
instead of leaving the others hanging in a collective (the failure of optuna-examples #101).
"""

from __future__ import annotations

from optuna_saturn.integrations.ways_in import WaysIn
from optuna_saturn.training.training_trial import TrainingTrial, TrialMoved

__all__ = ["SaturnTrial", "TrialMoved"]


class SaturnTrial(TrainingTrial, WaysIn):
    """What ``objective(trial)`` gets inside a worker. Mirrors ``optuna.Trial`` for suggest/report/prune; the helpers a
    distributed training loop needs come from :class:`~optuna_saturn.training.training_trial.TrainingTrial`, the ways in
    for Accelerate, Hugging Face Trainer and Lightning scripts from :class:`WaysIn`."""
