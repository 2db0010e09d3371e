"""The ``trial`` that a launched objective receives: an Optuna trial relayed to the parent, plus the helpers a
distributed training loop needs.

Every rank calls the same trial methods in the same order. Rank 0 asks the executor, which calls the real
``optuna.Trial`` (so the study's own sampler and pruner decide); the answer is broadcast so all ranks see the same
hyperparameters and the same pruning decision. A pruned trial therefore stops on every rank at the same step
instead of leaving the others hanging in a collective (the failure of optuna-examples #101).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from optuna_saturn.channel import ChannelClient
from optuna_saturn.engines import Engine
from optuna_saturn.microbatch import AccumulationError, split_batch
from optuna_saturn.strategy import Strategy

_PROGRESS_EVERY_S = 2.0


class ProfileComplete(BaseException):
    """Ends a profiling run that enters a second ``trial.steps`` loop: the profile times the first. A
    BaseException, so the objective's own ``except Exception`` does not swallow it."""


@dataclass(frozen=True)
class StepTimings:
    """What a profiling run measured of the training loop: its start, the timed steps, and when it ended (the
    rest of the objective, e.g. a final evaluation, runs after that and is timed by the worker)."""

    first_step_at: float
    step_seconds: list[float]
    loop_ended_at: float


@dataclass
class _MicroBatch:
    """Where ``micro_batches`` stands: which micro-batch, its share of the batch's rows, whether it was backed."""

    index: int
    count: int
    share: float
    backward_called: bool = False

    @property
    def last(self) -> bool:
        return self.index == self.count - 1


class SaturnTrial:
    """What ``objective(trial)`` gets inside a worker. Mirrors ``optuna.Trial`` for suggest/report/prune."""

    def __init__(
        self,
        *,
        number: int,
        strategy: Strategy,
        engine: Engine,
        channel: ChannelClient | None,
        control_group: Any,
        profile: dict | None = None,
    ) -> None:
        self.number = number
        self.strategy = strategy
        self._engine = engine
        self._channel = channel
        self._group = control_group
        self._profile = profile
        self._models: list[torch.nn.Module] = []
        self._micro_batch: _MicroBatch | None = None  # while inside micro_batches()
        self.steps_started = False  # the training loop began: memory now goes to activations, not the model
        self.profile_timings: StepTimings | None = None  # set when a profiling run's timed loop ends

    # -- where this process stands --------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._engine.context.rank

    @property
    def local_rank(self) -> int:
        return self._engine.context.local_rank

    @property
    def world_size(self) -> int:
        return self._engine.context.world_size

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        return self._engine.context.device

    # -- Optuna, relayed ------------------------------------------------------------------------------------------
    def _ask_and_broadcast(self, op: str, **fields: Any) -> Any:
        """Rank 0 asks the parent; everyone gets rank 0's answer (or its error)."""
        answer: list[Any] = [None]
        if self._channel is not None:
            try:
                answer = [("ok", self._channel.call(op, **fields))]
            except Exception as exc:  # every rank must raise the same error, not just rank 0
                answer = [("error", exc)]
        if self.world_size > 1:
            dist.broadcast_object_list(answer, src=0, group=self._group)
        status, value = answer[0]
        if status == "error":
            raise value
        return value

    def _relay(self, op: str, **fields: Any) -> None:
        if self._channel is not None:
            self._channel.call(op, **fields)

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False) -> float:
        return self._ask_and_broadcast(
            "suggest", method="suggest_float", args=[name, low, high], kwargs={"step": step, "log": log}
        )

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        return self._ask_and_broadcast(
            "suggest", method="suggest_int", args=[name, low, high], kwargs={"step": step, "log": log}
        )

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        return self._ask_and_broadcast("suggest", method="suggest_categorical", args=[name, list(choices)], kwargs={})

    def report(self, value: float, step: int) -> None:
        """Report an intermediate value (rank 0's value is the one recorded)."""
        if self._profile is None:
            self._relay("report", value=float(value), step=int(step))

    def should_prune(self) -> bool:
        """The study's pruner decides, once, for all ranks."""
        return self._profile is None and bool(self._ask_and_broadcast("should_prune"))

    def set_user_attr(self, key: str, value: Any) -> None:
        if self._profile is None:
            self._relay("set_user_attr", key=key, value=value)

    @property
    def params(self) -> dict[str, Any]:
        return self._ask_and_broadcast("params")

    @property
    def study(self) -> Any:
        raise AttributeError(
            "The study lives in the executor's process, not in the worker. Use trial.suggest_*, report, "
            "should_prune and set_user_attr, which are relayed to it."
        )

    # -- distributed training helpers -----------------------------------------------------------------------------
    def prepare(self, *objects: Any) -> Any:
        """Apply the trial's strategy to a model, its optimizer and data loaders, in any order.

        Returns the prepared objects in the order given (a single object when one is given). Create the
        optimizer before calling: sharding strategies rebuild it over the sharded parameters. A DataLoader's
        ``batch_size`` is the trial's global batch: it is split over ranks.
        """
        modules = [o for o in objects if isinstance(o, torch.nn.Module)]
        optimizers = [o for o in objects if isinstance(o, torch.optim.Optimizer)]
        if len(modules) > 1 or len(optimizers) > 1:
            raise ValueError("trial.prepare() takes one model and one optimizer; prepare others in another call.")
        if optimizers and not modules:
            raise ValueError("Pass the model with its optimizer: trial.prepare(model, optimizer, loader).")
        model = optimizer = None
        if modules:
            model, optimizer = self._engine.prepare_model_and_optimizer(modules[0], optimizers[0] if optimizers else None)
            self._models.append(model)
        prepared: list[Any] = []
        for obj in objects:
            if isinstance(obj, torch.nn.Module):
                prepared.append(model)
            elif isinstance(obj, torch.optim.Optimizer):
                prepared.append(optimizer)
            elif isinstance(obj, DataLoader):
                prepared.append(self._engine.prepare_dataloader(obj))
            else:
                raise TypeError(f"trial.prepare() cannot prepare a {type(obj).__name__}.")
        return prepared[0] if len(prepared) == 1 else tuple(prepared)

    @property
    def gradient_accumulation(self) -> int:
        """Micro-batches per optimizer step on each device (1: none). The planner raises it only for options
        where the whole per-device batch runs out of memory; ``micro_batches`` applies it."""
        return self._engine.context.gradient_accumulation

    def micro_batches(self, batch: Any) -> Iterator[Any]:
        """The batch as the micro-batches this trial accumulates over: forward and ``trial.backward`` each one,
        then step the optimizer once, as usual.

        ::

            for step in trial.steps(n):
                x, y = next(batches)
                optimizer.zero_grad()
                for mx, my in trial.micro_batches((x, y)):
                    trial.backward(loss_fn(model(mx), my))
                optimizer.step()

        The global batch and the samples each step sees do not change, so neither does the result (up to float
        rounding): each micro-batch's mean loss counts by its share of the rows. With one micro-batch (the usual
        case) the batch itself is yielded, untouched.
        """
        count = self.gradient_accumulation
        model = self._models[-1] if self._models else None
        for index, (part, share) in enumerate(split_batch(batch, count)):
            self._micro_batch = _MicroBatch(index, count, share)
            try:
                with self._engine.gradient_sync(model, sync=index == count - 1):
                    yield part
                if count > 1 and not self._micro_batch.backward_called:
                    raise AccumulationError(
                        "A micro-batch ended without trial.backward(loss). Call trial.backward(loss), not "
                        "loss.backward(), inside `for part in trial.micro_batches(batch):`: it weighs each "
                        "micro-batch's loss and lets the strategy synchronise gradients once per step."
                    )
            finally:
                self._micro_batch = None

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` the way the strategy needs it (DeepSpeed, for one, must own the backward pass).

        Inside ``micro_batches`` the loss is that micro-batch's mean; accumulated, the gradients are the whole
        batch's."""
        if self.gradient_accumulation > 1 and self._micro_batch is None:
            raise AccumulationError(
                f"This trial runs with gradient accumulation over {self.gradient_accumulation} micro-batches, but "
                "trial.backward() was called outside `for part in trial.micro_batches(batch):`. Split each batch "
                "with trial.micro_batches(), or remove accumulation from the strategy's knobs."
            )
        micro = self._micro_batch
        if micro is not None:
            micro.backward_called = True
        self._engine.backward(
            loss, self._models[-1] if self._models else None,
            share=1.0 if micro is None else micro.share, last_micro_batch=micro is None or micro.last,
        )

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The user's own module inside a DDP/FSDP/DeepSpeed wrapper (for saving or inspection)."""
        return self._engine.unwrap(model)

    def reduce_mean(self, value: float | torch.Tensor) -> float:
        """The mean of a number over all ranks, e.g. a validation loss computed on each rank's shard."""
        tensor = torch.as_tensor(value, dtype=torch.float64).detach().cpu().reshape(1)
        if self.world_size > 1:
            dist.all_reduce(tensor, group=self._group)
            tensor /= self.world_size
        return float(tensor.item())

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier(group=self._group)

    @property
    def is_profiling(self) -> bool:
        """True in a short profiling run: ``steps()`` stops after a few timed steps; reports are not recorded."""
        return self._profile is not None

    def step_budget(self, steps: int) -> int:
        """How many of ``steps`` this run may take: all of them, unless the profiler is timing a short run."""
        if self._profile is not None:
            return min(steps, self._profile["warmup"] + self._profile["timed"])
        return steps

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def steps(self, total: int) -> Iterator[int]:
        """``range(total)`` that also times the steps and reports progress to the executor.

        The executor uses these timings for progress, ETA, and to correct the runtime estimates of later plans.
        In a profiling run it yields a few steps only, timed with device synchronisation, then ends the loop
        early: what the objective does after its loop (a final evaluation, saving) runs too, and is timed.
        """
        self.steps_started = True
        if self._profile is not None:
            yield from self._profiled_steps(total)
            return
        budget = self.step_budget(total)
        last_report = started = time.perf_counter()
        for step in range(budget):
            yield step
            now = time.perf_counter()
            if step == 0 or now - last_report >= _PROGRESS_EVERY_S or step == budget - 1:
                self._synchronize()
                now = time.perf_counter()
                self._relay("progress", step=step + 1, total=budget, elapsed=now - started)
                last_report = now

    def _profiled_steps(self, total: int) -> Iterator[int]:
        if self.profile_timings is not None:
            raise ProfileComplete  # a second training loop; the profile covers the first
        warmup = self._profile["warmup"]
        budget = self.step_budget(total)
        first_step_at = time.time()
        durations: list[float] = []
        self._synchronize()
        for step in range(budget):
            began = time.perf_counter()
            yield step
            self._synchronize()
            if step >= warmup:
                durations.append(time.perf_counter() - began)
        self.profile_timings = StepTimings(first_step_at, durations, time.time())
