"""The callback ``trial.lightning_trainer`` adds: the trainer's optimizer steps are the trial's steps, its
validations are the trial's reports (the study's pruner stops every rank), and after each validation the trial
checkpoints through ``trial.checkpoint``, with Lightning's loop and callback states, so that a trial whose worker
dies, or that the sweep moves to another option, goes on from there."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import optuna
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from optuna_saturn.training import trainer_state

if TYPE_CHECKING:
    from optuna_saturn.training.training_trial import TrainingTrial


class TrialCallback(pl.Callback):
    def __init__(self, trial: TrainingTrial, metric: str, *, checkpoints: bool) -> None:
        self._trial = trial
        self._metric = metric
        self._checkpoints = checkpoints
        self._steps: Any = None
        self._counted = 0
        self._reported: set[int] = set()
        self._save_due = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._counted = trainer.global_step  # (a resumed fit starts past its checkpoint's step)
        self._steps = iter(self._trial.steps(int(trainer.estimated_stepping_batches), start=self._counted))
        self._advance(trainer)  # the first step begins

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        while self._steps is not None and self._counted < trainer.global_step:  # an optimizer step ended
            self._counted += 1
            self._advance(trainer)
        if self._save_due:
            self._save_due = False
            self._save(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._steps is not None:
            self._steps.close()
            self._steps = None

    def _advance(self, trainer: pl.Trainer) -> None:
        """End the step that ran, begin the next; a profiling run's loop ends after its timed steps."""
        try:
            next(self._steps)
        except StopIteration:
            self._steps = None
            trainer.should_stop = True

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        metrics = trainer.callback_metrics
        if self._metric not in metrics:
            raise KeyError(
                f"trial.lightning_trainer(metric={self._metric!r}): the validation logged no such metric (it "
                f"logged {sorted(metrics)}). Log it with self.log({self._metric!r}, ...) in validation_step, or pass "
                "the metric to report and prune on."
            )
        step = trainer.global_step
        if step in self._reported:
            return
        self._reported.add(step)
        value = float(metrics[self._metric])
        self._trial.report(value, step)
        if self._trial.should_prune():  # the study's pruner decides once, for every rank
            raise optuna.TrialPruned(f"pruned at step {step} ({self._metric}={value})")
        # saved at the next batch's end: after every callback's own end of this validation (ModelCheckpoint's
        # best score, EarlyStopping's patience), which Lightning calls after this one
        self._save_due = self._checkpoints

    def _save(self, trainer: pl.Trainer) -> None:
        strategy = trainer.strategy
        schedulers = trainer.lr_scheduler_configs
        assert strategy.model is not None  # (saved at a training batch's end: the strategy holds the model)
        self._trial._save_checkpoint(
            trainer.global_step,
            strategy.model,
            strategy.optimizers[0] if strategy.optimizers else None,
            schedulers[0].scheduler if schedulers else None,
            extra=lightning_state(trainer),
        )


def lightning_state(trainer: pl.Trainer) -> dict[str, Any]:
    """The fit loop's progress and the callbacks' states (what Lightning's own checkpoint keeps besides the
    model and the optimizer), rank 0's. A callback whose state JSON cannot keep (the checkpoint's trainer state is
    JSON, never a pickle) is left out, and said once: it starts afresh when the trial resumes."""
    callbacks = {}
    for callback in trainer.callbacks:  # type: ignore[attr-defined]  # set by Lightning's connector, untyped
        if isinstance(callback, TrialCallback):
            continue
        state = callback.state_dict()
        try:
            trainer_state.dumps(state)
        except (TypeError, ValueError) as exc:
            if callback.state_key not in _SAID:
                _SAID.add(callback.state_key)
                rank_zero_warn(f"optuna-saturn: {callback.state_key}'s state is not in the trial's checkpoint ({exc}).")
            continue
        callbacks[str(callback.state_key)] = state
    return {"loops": trainer.fit_loop.state_dict(), "callbacks": callbacks}


#: The callbacks whose state was said to be left out of the checkpoint.
_SAID: set[str] = set()


def restore_lightning_state(trainer: pl.Trainer, state: dict[str, Any]) -> None:
    """Where :func:`lightning_state` was: the fit loop goes on at its step, the callbacks as they stood."""
    trainer.fit_loop.load_state_dict(state["loops"])
    saved = state.get("callbacks", {})
    for callback in trainer.callbacks:  # type: ignore[attr-defined]  # set by Lightning's connector, untyped
        if str(callback.state_key) in saved:
            callback.load_state_dict(saved[str(callback.state_key)])
