"""A ``transformers.Trainer`` run as an optuna-saturn trial: one added call, ``trial.prepare_trainer(trainer)``.

Why not ``TrainingArguments(fsdp=..., deepspeed=...)``: on CPU, Trainer and Accelerate turn both into plain data
parallelism without a word, and the strategy is the sweep's choice per trial, not the script's. The trainer gets a
:class:`~optuna_saturn.integrations.accelerate.SaturnAccelerator` instead, which applies the trial's strategy
through the same engine as ``trial.prepare``; a callback counts its optimizer steps as the trial's steps
(progress, runtime profiling) and turns its evaluations into ``trial.report`` and pruning.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import optuna
from accelerate.utils import GradientAccumulationPlugin
from transformers import Trainer, TrainerCallback

from optuna_saturn.engines import StrategyMismatch
from optuna_saturn.integrations.accelerate import SaturnAccelerator
from optuna_saturn.training.microbatch import AccumulationError

if TYPE_CHECKING:
    from optuna_saturn.training.training_trial import TrainingTrial


def prepare_trainer(trial: TrainingTrial, trainer: Trainer, *, metric: str = "eval_loss") -> Trainer:
    """See :meth:`optuna_saturn.SaturnTrial.prepare_trainer`."""
    if not isinstance(trainer, Trainer):
        raise TypeError(f"trial.prepare_trainer() takes a transformers.Trainer, got {type(trainer).__name__}.")
    args = trainer.args
    _refuse_own_strategy(trainer)
    if trial.gradient_accumulation > 1:
        raise AccumulationError(
            f"The planner would split each batch into {trial.gradient_accumulation} micro-batches for "
            f"'{trial.strategy.name}', which a Trainer cannot follow from outside; this option is left out for the "
            "trial. Set gradient_accumulation_steps in TrainingArguments to accumulate yourself."
        )
    engine = trial._engine
    if engine.shards_parameters and getattr(args.save_strategy, "value", args.save_strategy) != "no":
        raise StrategyMismatch(
            f"'{trial.strategy.name}' shards the parameters and optimizer state over the ranks, and Trainer's "
            "checkpoints (save_strategy) would save one rank's shard as if it were the whole. The planner leaves "
            "this strategy out for this trial; set save_strategy='no' (and save the final model with "
            "trainer.save_model(), which gathers it) to let sharded strategies run it."
        )
    if engine.counts_micro_batches and args.gradient_accumulation_steps > 1:
        raise StrategyMismatch(
            f"'{trial.strategy.name}' (DeepSpeed) counts micro-batches itself and cannot follow Trainer's "
            "gradient_accumulation_steps > 1; the planner leaves it out for this trial."
        )
    accelerator = SaturnAccelerator(
        trial,
        count_steps=False,
        mixed_precision=trainer.accelerator.mixed_precision,
        dataloader_config=trainer.accelerator.dataloader_config,
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=1),  # Trainer accumulates itself
    )
    trainer.accelerator = accelerator
    trainer.gather_function = accelerator.gather_for_metrics
    if "use_gather_object" in inspect.signature(trainer.gather_function).parameters:
        trainer.gather_function = functools.partial(
            trainer.gather_function, use_gather_object=args.eval_use_gather_object
        )
    trainer.is_deepspeed_enabled = trainer.is_fsdp_enabled = False
    # One process drives one device: Trainer must neither wrap the model in DataParallel over every visible GPU
    # nor place it on cuda:LOCAL_RANK (the trial's ranks are numbered within the trial, not on the machine).
    args._n_gpu = 1 if trial.device.type == "cuda" else 0
    args.__dict__["_setup_devices"] = trial.device
    # The DataLoader's batch is the trial's global batch, as written for one process; each rank gets its rows.
    trainer._train_batch_size = args.per_device_train_batch_size
    run = f"trial-{trial.number}" + (f"-profile-{trial.strategy.name}" if trial.is_profiling else "")
    args.output_dir = os.path.join(args.output_dir or "trainer_output", run)
    if engine.shards_parameters:
        # (this trainer's save_model gathers the shards first: patched on the instance)
        trainer.save_model = functools.partial(_save_gathered, trial, trainer)  # type: ignore[method-assign]  # see above
    trainer.add_callback(_TrialCallback(trial, metric))
    return trainer


def _refuse_own_strategy(trainer: Trainer) -> None:
    args = trainer.args
    own = []
    if args.fsdp:
        own.append(f"fsdp={args.fsdp!r}")
    if args.deepspeed:
        own.append("deepspeed=...")
    if own or trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
        raise ValueError(
            f"TrainingArguments({', '.join(own) or 'an FSDP/DeepSpeed configuration'}) would choose the "
            "parallelism strategy, which optuna-saturn chooses for each trial. Remove it; list the strategies the "
            "sweep may use with SaturnExecutor(strategies=[...]) instead."
        )


def _save_gathered(
    trial: TrainingTrial, trainer: Trainer, output_dir: str | None = None, _internal_call: bool = False
) -> None:
    """``trainer.save_model`` under a sharding strategy: every rank gives its shard, rank 0 saves the whole."""
    state = trial.state_dict(trainer.model_wrapped)
    if trainer.args.should_save:
        trainer._save(output_dir, state_dict=state)


class _TrialCallback(TrainerCallback):
    """The trainer's optimizer steps are the trial's steps; its evaluations are the trial's reports."""

    def __init__(self, trial: TrainingTrial, metric: str) -> None:
        self._trial = trial
        self._metric = metric
        self._steps: Generator[int, None, None] | None = None
        self._reported_steps: set[int] = set()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._steps = self._trial.steps(state.max_steps)  # (a generator: closed when training ends)
        self._advance(control)  # step 0 begins

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._advance(control)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._steps is not None:
            self._steps.close()
            self._steps = None

    def _advance(self, control: Any) -> None:
        """End the step that ran, begin the next; a profiling run's loop ends after its timed steps."""
        if self._steps is None:
            return
        try:
            next(self._steps)
        except StopIteration:
            self._steps = None
            control.should_training_stop = True

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict | None = None, **kwargs: Any) -> None:
        metrics = metrics or {}
        if self._metric not in metrics:
            raise KeyError(
                f"trial.prepare_trainer(metric={self._metric!r}): the evaluation returned no such metric "
                f"(it returned {sorted(metrics)}). Pass the metric to report and prune on."
            )
        if state.global_step in self._reported_steps:  # trainer.evaluate() after an evaluation at the last step
            return
        self._reported_steps.add(state.global_step)
        self._trial.report(float(metrics[self._metric]), state.global_step)
        if self._trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {state.global_step} ({self._metric}={metrics[self._metric]})")
