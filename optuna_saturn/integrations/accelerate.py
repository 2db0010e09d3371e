"""An ``accelerate.Accelerator`` whose ``prepare``, ``backward`` and friends apply the trial's strategy.

Why not Accelerate's own plugins: on CPU, ``AcceleratorState`` turns an FSDP or DeepSpeed plugin into plain
multi-process data parallelism without a word (``distributed_type`` becomes ``MULTI_CPU``), so a sweep would
time and report "fsdp" while running DDP. Routing the few calls a training script makes through the trial's
engine (the same one ``trial.prepare`` uses) makes every strategy real on every device, and keeps the contract of
:class:`~optuna_saturn.SaturnTrial`: the same trial computes the same thing under every strategy.

Get one with ``trial.accelerator()`` (an Accelerate script) or let ``trial.prepare_trainer(trainer)`` install one
(a ``transformers.Trainer``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import MethodType
from typing import TYPE_CHECKING, Any

import torch
from accelerate import Accelerator
from accelerate.data_loader import SeedableRandomSampler
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.scheduler import AcceleratedScheduler
from accelerate.utils import convert_outputs_to_fp32, get_mixed_precision_context_manager
from torch.utils.data import DataLoader, RandomSampler

from optuna_saturn.engines import StrategyMismatch
from optuna_saturn.engines._base import loss_scaler_mismatch
from optuna_saturn.training.microbatch import AccumulationError, batch_rows
from optuna_saturn.training.sharding import LoaderView, RankRows

if TYPE_CHECKING:
    from optuna_saturn.training.training_trial import TrainingTrial

#: Accelerator arguments that would pick a strategy (or precision handling) behind optuna-saturn's back.
_STRATEGY_ARGUMENTS = (
    "fsdp_plugin",
    "deepspeed_plugin",
    "deepspeed_plugins",
    "megatron_lm_plugin",
    "torch_tp_plugin",
    "parallelism_config",
)
_STRATEGY_ENVIRONMENT = ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_MEGATRON_LM")


class SaturnAccelerator(Accelerator):
    """``Accelerator(**kwargs)`` for a script run as an optuna-saturn trial: the trial's strategy, not
    Accelerate's launch configuration, decides how the model is distributed.

    What differs from a plain ``Accelerator``, on purpose:

    - ``prepare`` hands models, optimizers and DataLoaders to ``trial.prepare`` (so FSDP really shards and ZeRO is
      really ZeRO, on CPU too). A DataLoader's ``batch_size`` is the trial's global batch, as written for one
      process: each rank gets its rows of every batch (Accelerate's ``split_batches=True``), so the data, the
      order and the result do not depend on the number of devices. An LR scheduler steps once per optimizer step.
    - ``backward``, ``no_sync``/``accumulate``, ``clip_grad_norm_``, ``gather_for_metrics``, ``unwrap_model``
      and ``get_state_dict`` go through the trial's engine.
    - A prepared DataLoader iterated while the prepared model is in training mode counts as the trial's training
      loop (progress, runtime profiling): no ``trial.steps`` needed. Pass ``count_steps=False`` when the steps are
      counted elsewhere (``prepare_trainer`` counts optimizer steps through a callback).
    - ``mixed_precision="bf16"`` (or ``"fp16"``, with Accelerate's loss scaler) runs the prepared model's forward
      under autocast, as Accelerate does, whatever the strategy: the strategy never changes the precision, so the
      trial computes the same under each (DeepSpeed's and FSDP's own mixed-precision modes would not). fp16's
      loss scaler cannot see the gradients a sharding strategy lays out its own way: under FSDP and ZeRO it is a
      mismatch (the planner leaves them out; bf16 needs no scaler).
    - Strategy plugins (``fsdp_plugin``, ``deepspeed_plugin``, ...) are refused: the strategy is the sweep's
      choice.
    """

    def __init__(self, trial: TrainingTrial, *, count_steps: bool = True, **kwargs: Any) -> None:
        given = [name for name in _STRATEGY_ARGUMENTS if kwargs.get(name) is not None]
        if given:
            raise ValueError(
                f"Accelerator({', '.join(given)}=...) would choose the parallelism strategy, which is "
                "optuna-saturn's choice for each trial (trial.strategy). Remove it; list the strategies the sweep "
                "may use with SaturnExecutor(strategies=[...]) instead."
            )
        set_in_environment = [name for name in _STRATEGY_ENVIRONMENT if os.environ.get(name, "").lower() == "true"]
        if set_in_environment:
            raise ValueError(
                f"{', '.join(set_in_environment)} is set in the environment (by an Accelerate config, or by "
                "TrainingArguments(fsdp=..., deepspeed=...)): the strategy is optuna-saturn's choice for each trial. "
                "Remove the FSDP/DeepSpeed settings from the objective."
            )
        precision = str(kwargs.get("mixed_precision") or os.environ.get("ACCELERATE_MIXED_PRECISION", "no"))
        if precision not in ("no", "bf16", "fp16"):
            raise ValueError(
                f"mixed_precision={precision!r}: optuna-saturn runs 'bf16' and 'fp16' (autocast) under every "
                "strategy; use one of them, or 'no'."
            )
        if precision == "fp16" and not trial._engine.takes_a_loss_scaler:
            raise loss_scaler_mismatch(trial.strategy.name)
        kwargs.setdefault("cpu", trial.device.type == "cpu")
        self._saturn_trial = trial  # (first: Accelerator's own set-up reads self.device)
        self._count_steps = count_steps
        self._rows_seen: int | None = None  # rows of the batch a prepared loader yielded last (one process)
        super().__init__(**kwargs)

    @property
    def device(self) -> torch.device:
        return self._saturn_trial.device

    # -- preparing ----------------------------------------------------------------------------------------------
    def prepare(self, *args: Any, device_placement: Any = None) -> Any:
        """The trial's strategy applied to the model, optimizer and DataLoaders among ``args``; schedulers step with
        the optimizer; anything else comes back as it is. Returned in the order given."""
        if device_placement is not None:
            raise ValueError("prepare(device_placement=...) is not supported: the trial's strategy places the model.")
        trial = self._saturn_trial
        strategy_objects = [
            a
            for a in args
            if isinstance(a, (torch.nn.Module, torch.optim.Optimizer, DataLoader))
            and not isinstance(a, AcceleratedOptimizer)
        ]
        if any(isinstance(a, torch.optim.Optimizer) for a in strategy_objects) and not any(
            isinstance(a, torch.nn.Module) for a in strategy_objects
        ):
            raise ValueError(
                "Prepare the model together with its optimizer, accelerator.prepare(model, optimizer, ...): sharding "
                "strategies must point the optimizer at the sharded parameters."
            )
        for loader in (a for a in strategy_objects if isinstance(a, DataLoader)):
            self._seed_its_order(loader)
        prepared = trial.prepare(*strategy_objects) if strategy_objects else ()
        if len(strategy_objects) == 1:
            prepared = (prepared,)
        by_id = {id(original): result for original, result in zip(strategy_objects, prepared)}
        results = []
        for obj in args:
            result = by_id.get(id(obj), obj)
            if isinstance(obj, torch.nn.Module):
                self._autocast_forward(trial._engine.user_module(result))  # (inside the strategy's wrapper)
                self._models.append(result)
            elif isinstance(obj, torch.optim.Optimizer) and not isinstance(obj, AcceleratedOptimizer):
                result = AcceleratedOptimizer(result, device_placement=False, scaler=self.scaler)
                self._optimizers.append(result)
            elif isinstance(obj, DataLoader):
                result = _CountedSteps(result, self) if self._count_steps else result
                result = _RowsNoted(result, self) if trial.world_size == 1 else result
                self._dataloaders.append(result)
            elif isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
                result = AcceleratedScheduler(
                    obj, self._optimizers, step_with_optimizer=self.step_scheduler_with_optimizer, split_batches=True
                )
                self._schedulers.append(result)
            results.append(result)
        return results[0] if len(results) == 1 else tuple(results)

    def _seed_its_order(self, loader: DataLoader) -> None:
        """A shuffling DataLoader draws its order as Accelerate's own ``prepare`` makes it: with
        ``use_seedable_sampler`` (on in Trainer's accelerator config), each pass's order comes from the seed and the
        pass's number (Accelerate's ``SeedableRandomSampler``, told the pass as its ``DataLoaderShard`` tells it),
        not from the global generator as the pass begins.
        The same trial then sees the same batches as under a plain Trainer, whatever ran before its first pass."""
        config = getattr(self, "dataloader_config", None)
        batch_sampler = loader.batch_sampler
        sampler = getattr(batch_sampler, "sampler", None)
        if config is None or not config.use_seedable_sampler or type(sampler) is not RandomSampler:
            return
        batch_sampler.sampler = _SeededPerPass(  # type: ignore[union-attr]  # (a batch sampler: checked above)
            data_source=sampler.data_source,
            replacement=sampler.replacement,
            num_samples=sampler._num_samples,
            generator=sampler.generator,
            data_seed=config.data_seed,
        )

    def _autocast_forward(self, model: torch.nn.Module) -> None:
        """With mixed precision, the user's module's forward runs under autocast and returns float32, as
        Accelerate's ``prepare`` makes it, inside the strategy's wrapper (Trainer counts on it: it applies no
        autocast of its own, and evaluates the module without the wrapper)."""
        if not self.native_amp or hasattr(model, "_original_forward"):
            return
        # (torch types a module's attributes as tensors or modules; Accelerate keeps the forward there)
        model._original_forward = model.forward  # type: ignore[assignment]  # see above
        autocast = get_mixed_precision_context_manager(self.native_amp, self.autocast_handler)
        forward = getattr(model.forward, "__func__", None)
        if forward is None:
            model.forward = convert_outputs_to_fp32(autocast(model.forward))
        else:
            model.forward = MethodType(convert_outputs_to_fp32(autocast(forward)), model)

    def prepare_model(
        self, model: torch.nn.Module, device_placement: Any = None, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        if evaluation_mode:  # inference only: on the trial's device, no wrapping but autocast (as Accelerate does)
            model = model if any(m is model for m in self._models) else model.to(self.device)
            self._autocast_forward(model)
            return model
        prepared: torch.nn.Module = self.prepare(model)  # (one model in, one out)
        return prepared

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, device_placement: Any = None) -> Any:
        raise ValueError("Prepare the optimizer together with its model: accelerator.prepare(model, optimizer).")

    def prepare_data_loader(
        self, data_loader: DataLoader, device_placement: Any = None, slice_fn_for_dispatch: Any = None
    ) -> Any:
        return self.prepare(data_loader)

    def prepare_scheduler(self, scheduler: Any) -> Any:
        return self.prepare(scheduler)

    # -- training -----------------------------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        if kwargs.get("learning_rate") is not None:
            raise ValueError("LOMO optimizers are not supported under optuna-saturn's strategies.")
        loss = loss / self.gradient_accumulation_steps
        self._saturn_trial.backward(self.scaler.scale(loss) if self.scaler is not None else loss)

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Gradient accumulation without synchronising the micro-batches before the last one."""
        engine = self._saturn_trial._engine
        if engine.counts_micro_batches:
            raise StrategyMismatch(
                f"'{self._saturn_trial.strategy.name}' (DeepSpeed) counts micro-batches itself and cannot follow "
                "gradient accumulation driven from outside (accelerator.accumulate, or Trainer's "
                "gradient_accumulation_steps > 1). The planner leaves it out for this trial; to use DeepSpeed, "
                "accumulate with trial.micro_batches() in a plain loop."
            )
        with engine.gradient_sync(model, sync=False):
            yield

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor:
        """Over the whole model's gradients, however the strategy lays them out (torch's own function, routed
        to the engine by :mod:`optuna_saturn.engines._clipping`), unscaled first under fp16."""
        self.unscale_gradients()
        return torch.nn.utils.clip_grad_norm_(list(parameters), max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        self.unscale_gradients()
        torch.nn.utils.clip_grad_value_(list(parameters), clip_value)

    # -- results ------------------------------------------------------------------------------------------------
    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Each rank's per-row values of the last batch, gathered into the whole batch in order (tensors, or
        nested tuples, lists and dicts of them)."""
        if isinstance(input_data, torch.Tensor):
            return self._gather_tensor(input_data)
        if isinstance(input_data, (list, tuple)):
            return type(input_data)(self.gather_for_metrics(x) for x in input_data)
        if isinstance(input_data, dict):
            return type(input_data)({k: self.gather_for_metrics(v) for k, v in input_data.items()})
        return super().gather_for_metrics(input_data, use_gather_object=use_gather_object)

    def _gather_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """Trainer's evaluation loop repeats each batch's mean loss by the per-device batch size, and averages
        what it gathers; in one process Accelerate keeps as many of them as the batch has rows (the last batch of a
        pass may have fewer), so each batch weighs by its rows. Here a rank holds its share of the global batch, so
        the ranks' values are gathered by their rows into the whole batch's mean, and repeated once per row of the
        whole batch (the evaluation loss is then exactly one process's)."""
        gather = self._saturn_trial.gather_for_metrics
        rows = self._saturn_trial._batch
        if rows is None and self._rows_seen is not None:  # (one process: the batch its loader yielded last)
            rows = RankRows(0, self._rows_seen, self._rows_seen, 1.0)
        if rows is None or tensor.dim() != 1 or tensor.numel() == 0 or tensor.shape[0] == rows.stop - rows.start:
            return gather(tensor)
        if not bool((tensor == tensor[0]).all()):
            return gather(tensor)  # (raises the error that names the expected shape)
        whole = gather(tensor[:1].expand(rows.stop - rows.start))
        return whole.mean().expand(whole.shape[0]).to(tensor.dtype)

    def unwrap_model(
        self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> torch.nn.Module:
        """The user's module out of a DDP or DeepSpeed wrapper; a module whose parameters are sharded comes back
        as it is (no rank holds it whole: use ``get_state_dict`` to save it)."""
        return self._saturn_trial._engine.user_module(model)

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The whole model's state dict on rank 0 (gathered from the shards where there are shards), empty on the
        others. Call it on every rank."""
        return self._saturn_trial.state_dict(model)

    def save_state(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "accelerator.save_state() is not supported inside an optuna-saturn trial yet: it would save each "
            "rank's shard the strategy's way. Save the model with accelerator.get_state_dict(model) on every rank "
            "and torch.save on the main process."
        )

    load_state = save_state


class _SeededPerPass(SeedableRandomSampler):
    """Accelerate's seedable sampler, told which pass begins as Accelerate's ``DataLoaderShard`` tells it
    (``set_epoch(iteration)`` at each ``iter()``): a loop that takes a pass's batches with ``next()`` and never
    exhausts it (Trainer's) still gets each pass its own order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._passes = 0

    def __iter__(self) -> Iterator[int]:
        self.set_epoch(self._passes)
        self._passes += 1
        yield from super().__iter__()


class _RowsNoted(LoaderView):
    """A prepared DataLoader of a trial in one process, which notes how many rows each batch has: Trainer's
    evaluation repeats a batch's loss by the per-device batch size, and Accelerate keeps as many as the batch has
    rows (:meth:`SaturnAccelerator._gather_tensor`). A sharded loader tells the trial its rows itself."""

    def __init__(self, loader: DataLoader, accelerator: SaturnAccelerator) -> None:
        super().__init__(loader)
        self._accelerator = accelerator

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # torch types it as a private iterator
        for batch in self.loader:
            try:
                self._accelerator._rows_seen = batch_rows(batch)
            except AccumulationError:  # (no rows to count: nothing is repeated by them either)
                self._accelerator._rows_seen = None
            yield batch


class _CountedSteps(LoaderView):
    """A prepared DataLoader that, iterated while the prepared model trains, is the trial's training loop: each
    batch is a ``trial.steps`` step (progress; in a profiling run, a few timed steps, then the loop ends)."""

    def __init__(self, loader: DataLoader, accelerator: SaturnAccelerator) -> None:
        super().__init__(loader)
        self._accelerator = accelerator

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # torch types it as a private iterator
        models = self._accelerator._models
        if not models or not models[-1].training:
            return iter(self.loader)
        try:
            total = len(self.loader)
        except TypeError:  # an IterableDataset without a length: no step count to report progress against
            return iter(self.loader)
        steps = self._accelerator._saturn_trial.steps(total)
        return (batch for _, batch in zip(steps, self.loader))
