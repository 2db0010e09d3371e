"""The ways into a trial for scripts written with a training framework: an Accelerate script, a Hugging Face
``Trainer``, a Lightning ``Trainer``. Each gets the framework's own object with the trial's strategy applied, so
the script keeps its shape; the frameworks are imported only when their way in is used."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import lightning.pytorch as pl
    import transformers

    from optuna_saturn.integrations.accelerate import SaturnAccelerator
    from optuna_saturn.training.training_trial import TrainingTrial


class WaysIn:
    """Mixed into :class:`~optuna_saturn.SaturnTrial` (and mirrored by the stand-in trial that describes an
    objective before anything is launched)."""

    def _training_trial(self) -> TrainingTrial:
        return cast("TrainingTrial", self)  # (mixed into SaturnTrial alone, a TrainingTrial)

    def accelerator(self, **kwargs: Any) -> SaturnAccelerator:
        """An ``accelerate.Accelerator`` for a script written with Accelerate, with the trial's strategy applied.

        Use it where the script says ``Accelerator(...)``; ``accelerator.prepare``, ``backward``,
        ``accumulate``, ``clip_grad_norm_``, ``gather_for_metrics`` and ``get_state_dict`` then go through this
        trial's strategy (FSDP really shards, ZeRO is really ZeRO, on CPU too), and iterating the prepared
        training DataLoader counts the trial's steps. A DataLoader's ``batch_size`` is the global batch, as written
        for one process. See :class:`~optuna_saturn.integrations.accelerate.SaturnAccelerator`.
        """
        from optuna_saturn.integrations.accelerate import SaturnAccelerator

        return SaturnAccelerator(self._training_trial(), **kwargs)

    def prepare_trainer(self, trainer: transformers.Trainer, *, metric: str = "eval_loss") -> transformers.Trainer:
        """Run a ``transformers.Trainer`` under this trial's strategy; returns the same trainer.

        ::

            trainer = trial.prepare_trainer(Trainer(model=model, args=args, train_dataset=..., eval_dataset=...))
            trainer.train()
            return trainer.evaluate()["eval_loss"]

        What it changes: the trainer's accelerator applies the trial's strategy (leave ``fsdp``/``deepspeed`` out of
        ``TrainingArguments``: the strategy is the sweep's choice); ``per_device_train_batch_size`` is the global
        batch, as written for one process, and each rank gets its rows; its optimizer steps are the trial's steps
        (progress, runtime profiling); each evaluation reports ``metrics[metric]`` at the global step and prunes
        every rank when the study's pruner says so; it writes to ``<output_dir>/trial-<number>``. Under a
        sharding strategy, ``trainer.save_model()`` gathers the whole model on rank 0.
        """
        from optuna_saturn.integrations.trainer import prepare_trainer

        return prepare_trainer(self._training_trial(), trainer, metric=metric)

    def lightning_trainer(self, *, metric: str = "val_loss", checkpoints: bool = True, **kwargs: Any) -> pl.Trainer:
        """A ``lightning.Trainer(**kwargs)`` that runs this trial's strategy; use it where the script says
        ``lightning.Trainer(...)``.

        ::

            trainer = trial.lightning_trainer(max_steps=200, callbacks=[EarlyStopping("val_loss")])
            trainer.fit(module, datamodule=data)
            return trainer.callback_metrics["val_loss"].item()

        What differs from a plain ``Trainer``: the model, its optimizer and the DataLoaders go through the trial's
        engine, inside the sweep's process group (FSDP really shards and ZeRO is really ZeRO, on CPU too), and a
        DataLoader's ``batch_size`` is the global batch, as written for one process; each rank gets its rows.
        Leave ``strategy``, ``devices``, ``num_nodes``, ``plugins`` and ``accelerator`` out: the sweep picks them
        for each trial (conflicting values are refused, all at once, each with its fix). Each validation reports
        ``callback_metrics[metric]`` at the global step and prunes every rank when the study's pruner says so;
        the optimizer steps are the trial's steps (progress, runtime profiling). With ``checkpoints`` (the
        default), the trial checkpoints through ``trial.checkpoint`` after each validation, with Lightning's loop
        and callback states: a trial whose worker dies, or that the sweep moves, goes on from there. Logs go to
        ``<default_root_dir>/trial-<number>``, a CSV or TensorBoard logger's to its own ``trial-<number>``
        version, a ``ModelCheckpoint(dirpath=...)``'s files to ``<dirpath>/trial-<number>``; Lightning's
        checkpointing is on when a ``ModelCheckpoint`` is given, and its files hold the whole model under every
        strategy. See :mod:`optuna_saturn.integrations.lightning`.
        """
        from optuna_saturn.integrations.lightning import lightning_trainer

        return lightning_trainer(self._training_trial(), metric=metric, checkpoints=checkpoints, **kwargs)
