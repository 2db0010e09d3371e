"""Each rank's part of every batch the user's DataLoader would produce, so that the strategy never changes the data.

A trial's DataLoader is built for one process: its ``batch_size`` is the trial's global batch, its sampler (random,
weighted, a subset, the user's own, with or without a ``generator``) decides the order. Whatever strategy and device
count the planner picks, the trial must train on the same batches in the same order as ``single`` would. So the
user's loader keeps deciding the global batches, on every rank alike, and each rank takes its rows of each one:

- a map-style dataset: the user's batch sampler yields each global batch's indices; each rank loads only its slice
  (so loading work is split, and any ``collate_fn`` sees the rows it will get);
- an ``IterableDataset``: every rank iterates the user's loader and keeps its slice of each collated batch (the
  stream has no indices to split; Accelerate's ``IterableDatasetShard`` does the same).

Samplers that draw from the global random generators draw identically on every rank because every ``iter()``
first copies rank 0's random states (torch, NumPy, ``random``, and the loader's own generators) to the other
ranks; rank 0 itself draws exactly as a single process would.

No row is dropped and none is padded in: rows split as evenly as they go (see
:func:`~optuna_saturn.training.microbatch.partition`). Only a batch with fewer rows than ranks (the last of an epoch, at
most) gives some ranks a copy of a row, because a model cannot run on zero rows; its weight is reduced, so
``trial.backward`` still yields the whole batch's gradient exactly, and ``trial.gather_for_metrics`` leaves the
copies out. Which rows the rank got of the batch just yielded is reported through ``on_batch``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from optuna_saturn.training.microbatch import batch_rows, partition, take_rows
from optuna_saturn.training.random_state import capture, restore


@dataclass(frozen=True)
class RankRows:
    """Which rows of a global batch of ``rows`` rows this rank got: ``start:stop``. ``repeated``: a copy of a row
    another rank has too (the batch had fewer rows than ranks)."""

    start: int
    stop: int
    rows: int
    weight: float  # this rank's part of the batch's mean, times the world size (1.0 for an even split): the
    #                factor that makes the ranks' averaged gradients the whole batch's
    repeated: bool = False


def rank_rows(rows: int, rank: int, world_size: int) -> RankRows:
    start, stop, share = partition(rows, world_size)[rank]
    return RankRows(start, stop, rows, share * world_size, repeated=rank >= rows)


#: Called with this rank's rows of the batch it is about to use.
OnBatch = Callable[[RankRows], None]


class ShardingError(ValueError):
    """A DataLoader cannot be split over ranks without changing what the trial trains on."""


class LoaderView(DataLoader):
    """A DataLoader (``isinstance`` checks keep working) that delegates to the user's instead of loading itself:
    ``len()``, ``dataset``, ``batch_size`` (the global batch) and the sampler are the user's. Subclasses decide what
    iterating yields. ``DataLoader.__init__`` is not called."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        self.dataset = loader.dataset
        self.batch_size = loader.batch_size
        self.drop_last = loader.drop_last
        self.sampler = loader.sampler
        self.batch_sampler = loader.batch_sampler
        self.num_workers = loader.num_workers
        self.collate_fn = loader.collate_fn
        self.generator = loader.generator

    def __len__(self) -> int:
        return len(self.loader)

    # (torch's stub says DataLoader.__iter__ returns its private _BaseDataLoaderIter; any iterator serves a loop)
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # torch types it as a private iterator
        return iter(self.loader)

    def __getattr__(self, name: str) -> Any:
        """Any other DataLoader attribute is the user's loader's (frameworks read ``multiprocessing_context``,
        ``persistent_workers``, ``pin_memory``... of the loader they are given)."""
        if name == "loader":  # (not set yet)
            raise AttributeError(name)
        return getattr(self.loader, name)


class ShardedDataLoader(LoaderView):
    """This rank's view of the user's DataLoader: iterating yields this rank's rows of each global batch."""

    def __init__(self, loader: DataLoader, *, rank: int, world_size: int, group: Any, on_batch: OnBatch) -> None:
        _check_shardable(loader)
        super().__init__(loader)
        self._rank = rank
        self._world_size = world_size
        self._group = group
        self._on_batch = on_batch
        self._persistent: DataLoader | None = None

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # torch types it as a private iterator
        # Eager, as DataLoader.__iter__ is: the random states are shared, and the inner iterator (which draws its
        # workers' base seed) is created, at iter() time, exactly when a single process would draw.
        self._share_random_states()
        if isinstance(self.loader.dataset, IterableDataset):
            return self._slices_of(iter(self.loader))
        shares: deque[RankRows] = deque()
        return self._weighted(iter(self._index_loader(shares)), shares)

    def _weighted(self, batches: Iterator[Any], shares: deque[RankRows]) -> Iterator[Any]:
        for batch in batches:
            self._on_batch(shares.popleft())
            yield batch

    def _slices_of(self, batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            mine = rank_rows(batch_rows(batch), self._rank, self._world_size)
            self._on_batch(mine)
            yield take_rows(batch, mine.start, mine.stop)

    def _index_loader(self, shares: deque[RankRows]) -> DataLoader:
        """A DataLoader over this rank's indices of each global batch: the user's settings, the user's batch
        sampler underneath (persistent workers need the same loader every epoch)."""
        if self._persistent is not None:
            # (the loader built below: its batch sampler is a _RankBatchSampler)
            cast(_RankBatchSampler, self._persistent.batch_sampler).shares = shares
            return self._persistent
        user = self.loader
        loader = DataLoader(
            user.dataset,
            batch_sampler=_RankBatchSampler(user.batch_sampler, self._rank, self._world_size, shares),
            num_workers=user.num_workers,
            collate_fn=user.collate_fn,
            pin_memory=user.pin_memory,
            timeout=user.timeout,
            worker_init_fn=user.worker_init_fn,
            multiprocessing_context=user.multiprocessing_context,
            generator=user.generator,
            prefetch_factor=user.prefetch_factor,
            persistent_workers=user.persistent_workers,
            pin_memory_device=user.pin_memory_device,
            in_order=user.in_order,
        )
        if user.persistent_workers:
            self._persistent = loader
        return loader

    def _share_random_states(self) -> None:
        """Give every rank rank 0's random states, so samplers and iterable datasets that draw from them produce
        the same global batches everywhere."""
        if self._world_size == 1:
            return
        generators = [g for g in (self.loader.generator, getattr(self.loader.sampler, "generator", None)) if g]
        states: list[Any] = [None]
        if self._rank == 0:
            states = [capture(generators)]
        dist.broadcast_object_list(states, src=0, group=self._group)
        if self._rank != 0:
            restore(states[0], generators)


class _RankBatchSampler:
    """The user's batch sampler, yielding this rank's indices of each global batch (and queueing which they are)."""

    def __init__(self, batch_sampler: Any, rank: int, world_size: int, shares: deque[RankRows]) -> None:
        self.batch_sampler = batch_sampler
        self.rank = rank
        self.world_size = world_size
        self.shares = shares

    def __iter__(self) -> Iterator[list[Any]]:
        for indices in self.batch_sampler:
            indices = list(indices)
            mine = rank_rows(len(indices), self.rank, self.world_size)
            self.shares.append(mine)
            yield indices[mine.start : mine.stop]

    def __len__(self) -> int:
        return len(self.batch_sampler)


def _check_shardable(loader: DataLoader) -> None:
    if isinstance(loader.sampler, DistributedSampler):
        raise ShardingError(
            "This DataLoader uses a DistributedSampler. optuna-saturn gives each rank its part of every batch "
            "itself: build the DataLoader as for one process (shuffle=True or your own sampler, batch_size = the "
            "trial's global batch) and pass it to trial.prepare()."
        )
    if not isinstance(loader.dataset, IterableDataset) and loader.batch_sampler is None:
        raise ShardingError(
            "This DataLoader does not batch (batch_size=None), so its items cannot be split over ranks. Give it "
            "a batch_size (the trial's global batch) or a batch_sampler."
        )
    if not loader.in_order:
        raise ShardingError(
            "This DataLoader has in_order=False: its batch order would depend on worker timing, and so would the "
            "trial's result. Use in_order=True (the default)."
        )


def mean_over_ranks(value: float | torch.Tensor, weight: float | None, *, group: Any, world_size: int) -> float:
    """``trial.reduce_mean``: the mean of a number over all ranks, weighted by ``weight`` if given."""
    value = torch.as_tensor(value, dtype=torch.float64).detach().cpu().reshape(())
    if weight is None:
        sums = torch.stack([value, torch.ones((), dtype=torch.float64)])
    else:  # a rank without rows adds nothing, even if its value is nan
        weight_t = torch.as_tensor(float(weight), dtype=torch.float64)
        sums = torch.stack([torch.where(weight_t > 0, value * weight_t, 0.0), weight_t])
    if world_size > 1:
        dist.all_reduce(sums, group=group)
    return float(sums[0] / sums[1])


def max_over_ranks(value: float, *, group: Any, world_size: int) -> float:
    """The largest of a number over all ranks: for a decision every rank must take alike (a rank that decides on
    its own number alone would leave the others waiting in a different collective)."""
    if world_size == 1:
        return value
    largest = torch.tensor(float(value), dtype=torch.float64)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=group)
    return float(largest)


def gather_rows(tensor: torch.Tensor, rows: RankRows | None, *, group: Any, world_size: int) -> torch.Tensor:
    """``trial.gather_for_metrics``: this rank's per-row values of its last batch, gathered into the whole batch."""
    if world_size == 1 or rows is None:
        return tensor
    if tensor.dim() == 0 or tensor.shape[0] != rows.stop - rows.start:
        raise ValueError(
            f"gather_for_metrics() takes one value per row of this rank's batch "
            f"({rows.stop - rows.start} rows); got shape {tuple(tensor.shape)}."
        )
    pieces: list[Any] = [None] * world_size
    mine = None if rows.repeated else tensor.detach().cpu()
    dist.all_gather_object(pieces, mine, group=group)
    return torch.cat([p for p in pieces if p is not None]).to(tensor.device)
