"""The training helpers of the ``trial`` that a launched objective receives: what a distributed training loop
needs under every strategy (see :class:`TrainingTrial`). :mod:`optuna_saturn.trial` adds the ways in for
training frameworks, which are built on these."""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from optuna_saturn.channel import ChannelClient
from optuna_saturn.strategy import Strategy
from optuna_saturn.training import checkpoint
from optuna_saturn.training.checkpoint import CheckpointRecord
from optuna_saturn.training.checkpoint_paths import CheckpointNotWritten
from optuna_saturn.training.engine_protocol import TrainingEngine
from optuna_saturn.training.loader_positions import PositionedLoader
from optuna_saturn.training.microbatch import AccumulationError, MicroBatch, split_batch
from optuna_saturn.training.relayed import RelayedTrial
from optuna_saturn.training.sharding import RankRows, gather_rows, mean_over_ranks
from optuna_saturn.training.trial_steps import LoopProgress, ProfiledRanks, ProfilingLoader, StepTimings, profiled_steps


class TrialMoved(BaseException):
    """Raised by :meth:`~optuna_saturn.SaturnTrial.checkpoint` right after a checkpoint the executor asked for to
    move the trial (elastic resize): the run ends there, and the trial goes on from that checkpoint under another
    option. A ``BaseException``, like ``KeyboardInterrupt``, so that an objective's ``except Exception`` does not
    keep the run going."""

    def __init__(self, step: int) -> None:
        super().__init__(f"moved at step {step}")
        self.step = step


class TrainingTrial(RelayedTrial):
    """The trial's training helpers (:class:`~optuna_saturn.SaturnTrial` without the ways in for frameworks, which
    are built on these): devices and ranks, prepared objects, micro-batches, steps, checkpoints, reductions."""

    def __init__(
        self,
        *,
        number: int,
        strategy: Strategy,
        engine: TrainingEngine,
        channel: ChannelClient | None,
        control_group: Any,
        profile: dict | None = None,
        checkpoint: dict | None = None,
        known: dict | None = None,
    ) -> None:
        self._number = number
        self._known = dict(known or {})  # the real trial at the run's start (study/trial_snapshot.py)
        self.strategy = strategy
        self._engine = engine
        self._channel = channel
        self._group = control_group
        self._profile = profile
        self._models: list[torch.nn.Module] = []
        self._loaders: list[PositionedLoader] = []  # prepared DataLoaders, in the order prepared
        self._pending_positions: list[Any] = []  # a checkpoint's positions of loaders not prepared yet
        self._positions_kept = True  # whether prepared loaders are positioned (off for Lightning's evaluation ones)
        self._micro_batch: MicroBatch | None = None  # while inside micro_batches()
        self._batch: RankRows | None = None  # this rank's rows of the batch a prepared loader yielded last
        self._progress = LoopProgress(self._relay, self._synchronize)
        self.steps_started = False  # the training loop began: memory now goes to activations, not the model
        self.profile_timings: StepTimings | None = None  # set when a profiling run's timed loop ends
        checkpoint = checkpoint or {}
        self._checkpoint_dir = checkpoint.get("dir")  # this trial's checkpoint folder
        resume = checkpoint.get("resume")  # the checkpoint an earlier run of these params left
        self._resume = None if resume is None else CheckpointRecord.from_json(resume)
        self.resumed_from = 0  # the step restore() loaded

    def release(self) -> None:
        """The run is over: let go of what it prepared, to be freed before the worker's next run."""
        self._engine.release()
        self._models.clear()
        self._loaders.clear()
        self._micro_batch = self._batch = None

    @property
    def resumes(self) -> bool:
        """Whether this run goes on from a checkpoint an earlier run of the trial left (moved, or run again)."""
        return self._profile is None and self._resume is not None

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

    # -- distributed training helpers -----------------------------------------------------------------------------
    def prepare(self, *objects: Any) -> Any:
        """Apply the trial's strategy to a model, its optimizer and data loaders, in any order.

        Returns the prepared objects in the order given (a single object when one is given). Create the
        optimizer before calling (before its first step): sharding strategies point it at the sharded
        parameters. The optimizer you get back drives the same parameter groups, so an LR scheduler made before
        or after ``prepare`` works. A DataLoader is built as for one process: its ``batch_size`` is the trial's
        global batch, its sampler (or ``IterableDataset``) decides the order; each rank gets its rows of every
        batch, so the trial trains on the same data in the same order under every strategy.
        """
        modules = [o for o in objects if isinstance(o, torch.nn.Module)]
        optimizers = [o for o in objects if isinstance(o, torch.optim.Optimizer)]
        if len(modules) > 1 or len(optimizers) > 1:
            raise ValueError("trial.prepare() takes one model and one optimizer; prepare others in another call.")
        if optimizers and not modules:
            raise ValueError("Pass the model with its optimizer: trial.prepare(model, optimizer, loader).")
        model = optimizer = None
        if modules:
            model, optimizer = self._engine.prepare_model_and_optimizer(
                modules[0], optimizers[0] if optimizers else None
            )
            self._models.append(model)
        prepared: list[Any] = []
        for obj in objects:
            if isinstance(obj, torch.nn.Module):
                prepared.append(model)
            elif isinstance(obj, torch.optim.Optimizer):
                prepared.append(optimizer)
            elif isinstance(obj, DataLoader):
                loader = self._engine.prepare_dataloader(obj, self._on_batch)
                if self._profile is not None:
                    prepared.append(ProfilingLoader(loader, lambda: self.profile_timings))
                    continue
                if not self._positions_kept:  # (an evaluation loader a framework prepares: its passes are whole)
                    prepared.append(loader)
                    continue
                positioned = PositionedLoader(loader)  # a checkpoint saves where its pass is
                if self._pending_positions:  # (restored before it was prepared)
                    positioned.resume_at(self._pending_positions.pop(0))
                self._loaders.append(positioned)
                prepared.append(positioned)
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
            self._micro_batch = MicroBatch(index, count, share)
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

    def _on_batch(self, rows: RankRows) -> None:
        self._batch = rows

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` the way the strategy needs it (DeepSpeed, for one, must own the backward pass).

        The loss is the mean over this rank's rows of the batch (inside ``micro_batches``, over the micro-batch's).
        The gradients come out as the whole global batch's, as in one process, even when the batch does not
        split evenly over ranks or micro-batches (the last batch of an epoch): each piece is weighted by its
        rows."""
        if self.gradient_accumulation > 1 and self._micro_batch is None:
            raise AccumulationError(
                f"This trial runs with gradient accumulation over {self.gradient_accumulation} micro-batches, but "
                "trial.backward() was called outside `for part in trial.micro_batches(batch):`. Split each batch "
                "with trial.micro_batches(), or remove accumulation from the strategy's knobs."
            )
        micro = self._micro_batch
        if micro is not None:
            micro.backward_called = True
        weight = (1.0 if self._batch is None else self._batch.weight) * (1.0 if micro is None else micro.share)
        self._engine.backward(
            loss,
            self._models[-1] if self._models else None,
            weight=weight,
            last_micro_batch=micro is None or micro.last,
        )

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The user's own module inside a DDP or DeepSpeed ZeRO-1/2 wrapper (for inspection or saving).

        Under strategies that shard parameters (FSDP, ZeRO-3) no rank holds the whole module, so this raises an
        error that names :meth:`state_dict`, which gathers it."""
        return self._engine.unwrap(model)

    def state_dict(self, model: torch.nn.Module) -> dict[str, Any]:
        """The whole model's ``state_dict()``, as one process would have it, under every strategy: on rank 0;
        other ranks get an empty dict. Call it on every rank (gathering shards is collective)::

            state = trial.state_dict(model)
            if trial.is_main_process:
                torch.save(state, "best.pt")
        """
        return self._engine.full_state_dict(model)

    def checkpoint(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None
    ) -> None:
        """Save the training state after ``step`` steps (the prepared model and optimizer, the LR scheduler, the
        random generators), so that if this trial's sweep dies, the trial run again resumes here. Call it on
        every rank (saving shards is collective), every few hundred steps or at the end of an epoch; only the
        latest checkpoint is kept, and it is removed once the trial ends COMPLETE or PRUNED. A trial that
        checkpoints may also be moved by the executor to another strategy or device count while it runs (elastic
        resize): the run then ends inside this call, and the trial goes on from this checkpoint::

            start = trial.restore(model, optimizer, scheduler)   # 0 unless an earlier run left a checkpoint
            for step in trial.steps(total, start=start):
                ...
                if (step + 1) % 100 == 0:
                    trial.checkpoint(step + 1, model, optimizer, scheduler)

        Under single, DDP and FSDP it is a ``torch.distributed.checkpoint`` (it reshards, so the run again may
        use another of these strategies, or another device count); under DeepSpeed, DeepSpeed's own. A profiling
        run saves nothing."""
        self._save_checkpoint(step, model, optimizer, scheduler)

    def _save_checkpoint(
        self, step: int, model: torch.nn.Module, optimizer: Any, scheduler: Any, extra: dict | None = None
    ) -> None:
        """:meth:`checkpoint`, with a framework's own loop state (``extra``: Lightning's loops and callbacks)."""
        if self._profile is not None:
            return
        if self._checkpoint_dir is None:
            raise RuntimeError("This trial has no checkpoint folder (it was not started by a SaturnExecutor).")
        started = time.perf_counter()
        try:
            record = checkpoint.save(
                self._engine,
                Path(self._checkpoint_dir),
                step,
                model,
                optimizer,
                scheduler,
                group=self._group,
                loaders=[loader.position() for loader in self._loaders],
                extra=extra,
            )
        except OSError as exc:  # (a full disk ends this trial alone, with the reason; the sweep goes on)
            raise CheckpointNotWritten(self._checkpoint_dir, exc) from exc
        move = self._ask_and_broadcast("checkpointed", record=record.to_json(), seconds=time.perf_counter() - started)
        if self.rank == 0:
            checkpoint.prune(record)  # (the executor has stored the record: it answered)
        if move:
            raise TrialMoved(step)  # the executor moves this trial to another option: it goes on from here

    def restore(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None
    ) -> int:
        """Load the checkpoint that an earlier run of this trial's params left (see :meth:`checkpoint`) into the
        prepared model, optimizer and scheduler, and the random generators; returns its step, where the training
        loop goes on (``trial.steps(total, start=step)``). Returns 0 and loads nothing on a first run, and in a
        profiling run. Call it on every rank, after ``trial.prepare``.

        The random generators come back as they were at the checkpoint, and each prepared DataLoader's next pass
        goes on where its pass stood at the checkpoint (the same order, the batches already trained on skipped),
        so the trial resumes exactly as it would have gone on, at an epoch's end or in the middle of one, if its
        loop creates its iterators (``iter(loader)``, ``for batch in loader``) after this call."""
        return self._load_checkpoint(model, optimizer, scheduler)[0]

    def _load_checkpoint(self, model: torch.nn.Module, optimizer: Any, scheduler: Any) -> tuple[int, dict | None]:
        """:meth:`restore`, also returning the framework's loop state saved with it (``extra``). The positions of
        loaders not prepared yet (Lightning prepares them after this) are applied as they are prepared."""
        if self._profile is not None or self._resume is None:
            return 0, None
        record = checkpoint.resumable(self._resume, self._checkpoint_dir, say=self.rank == 0)
        if record is None:
            return 0, None
        self.resumed_from, positions, extra = checkpoint.load(
            self._engine, record, model, optimizer, scheduler, group=self._group
        )
        for loader, position in zip(self._loaders, positions):
            loader.resume_at(position)
        self._pending_positions = positions[len(self._loaders) :]
        self._resume = None  # (loaded: a second fit in this run goes on from where it stands, not from here)
        return self.resumed_from, extra

    def reduce_mean(self, value: float | torch.Tensor, weight: float | None = None) -> float:
        """The mean of a number over all ranks, e.g. a validation loss computed on each rank's rows.

        The plain mean is exact when every rank saw as many rows (every batch split evenly). Pass ``weight`` (the
        rows behind this rank's value) for the exact weighted mean in every case."""
        return mean_over_ranks(value, weight, group=self._group, world_size=self.world_size)

    def gather_for_metrics(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's per-row values of the batch a prepared loader yielded last, gathered from every rank into
        the whole batch, in order, as one process would have it (as Accelerate's ``gather_for_metrics``). Rows
        that a short batch repeats on some ranks are left out. Use it for metrics that must be exact::

            for x, y in val_loader:
                per_row = loss_fn(model(x), y, reduction="none")
                losses.append(trial.gather_for_metrics(per_row))
            value = torch.cat(losses).mean()
        """
        return gather_rows(tensor, self._batch, group=self._group, world_size=self.world_size)

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier(group=self._group)

    @property
    def is_profiling(self) -> bool:
        """True in a short profiling run: ``steps()`` stops after a few timed steps; reports are not recorded."""
        return self._profile is not None

    @property
    def is_real_run(self) -> bool:
        """True only in the run whose value the study gets. The objective also runs to describe the trial, to
        warm the pool up and to profile an option, each stopped early; guard side effects outside training
        (``wandb.init``, result files) with it::

            if trial.is_real_run and trial.is_main_process:
                wandb.init(project="sweep", name=f"trial-{trial.number}", config=trial.params)
        """
        return self._profile is None

    def step_budget(self, steps: int) -> int:
        """How many of ``steps`` this run may take: all of them, unless the profiler is timing a short run (at
        most its warm-up and twice its timed steps: unsettled timings are taken again)."""
        if self._profile is not None:
            return min(steps, int(self._profile["warmup"]) + 2 * int(self._profile["timed"]))
        return steps

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def steps(self, total: int, *, start: int = 0) -> Generator[int, None, None]:
        """``range(start, total)`` that also times the steps and reports progress to the executor (``start``:
        the step :meth:`restore` returned, for a trial that resumes from its checkpoint).

        Call it once for the whole training loop, or once per epoch (``for epoch in range(E): for step in
        trial.steps(len(loader))``): every loop counts towards the trial's progress and runtime. The executor uses
        these timings for progress, ETA, and to correct the runtime estimates of later plans. In a profiling run
        the first loop yields a few steps only, timed with device synchronisation, then ends early; later loops
        yield one step each and are counted (see :class:`StepTimings`).
        """
        self.steps_started = True
        total, start = int(total), int(start)
        if not 0 <= start <= total:
            raise ValueError(f"trial.steps(total={total}, start={start}): start must be between 0 and total.")
        if self._profile is not None:
            ranks = ProfiledRanks(
                int(self._profile["warmup"]),
                int(self._profile["timed"]),
                self._synchronize,
                self._group,
                self.world_size,
            )
            self.profile_timings = yield from profiled_steps(ranks, self.profile_timings, total)
            return
        yield from self._progress.loop(start, self.step_budget(total))
