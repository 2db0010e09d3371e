"""Cutting a batch into pieces by rows: a global batch into each rank's part, a rank's part into micro-batches.

Both cuts keep what a step computes the same as one process running the whole batch: every piece is non-empty
(models such as GPT-2 fail on a batch of zero rows), and each piece has a *share*, the part of the whole batch's
mean loss it stands for, so that weighting each piece's mean loss by its share adds up to the whole batch's mean.

The planner may run a trial with gradient accumulation when the whole per-device batch runs out of memory. The
global batch, the data order and (up to float rounding) the result stay the same; only activation memory shrinks,
and the step gets slower. The objective opts in by iterating ``trial.micro_batches(batch)``; splitting here, not in
the DataLoader, keeps every optimizer step seeing exactly the samples it would see without accumulation.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch


class AccumulationError(ValueError):
    """A batch cannot be split into the trial's micro-batches, or the objective does not split its batches."""


def partition(rows: int, parts: int) -> list[tuple[int, int, float]]:
    """``rows`` rows cut into ``parts`` non-empty contiguous pieces ``(start, stop, share)``.

    With at least as many rows as parts, the pieces' sizes differ by at most one and each share is its fraction of
    the rows. With fewer rows than parts (the short last batch of an epoch), pieces take one row each, round-robin,
    and a row that ``c`` pieces repeat counts ``1/c`` in each: shares still sum to 1 and every row weighs the same.
    """
    if rows < 1 or parts < 1:
        raise ValueError(f"cannot cut {rows} row(s) into {parts} piece(s)")
    if rows >= parts:
        bounds = [i * rows // parts for i in range(parts + 1)]
        return [(lo, hi, (hi - lo) / rows) for lo, hi in itertools.pairwise(bounds)]
    copies = [parts // rows + (1 if row < parts % rows else 0) for row in range(rows)]
    return [(piece % rows, piece % rows + 1, 1.0 / (rows * copies[piece % rows])) for piece in range(parts)]


def batch_rows(batch: Any) -> int:
    """The number of rows of a batch: the common first dimension of its tensors."""
    sizes = {t.shape[0] for t in tensors_of(batch) if t.dim() > 0}
    if not sizes:
        raise AccumulationError("found no tensor with a batch dimension in the batch.")
    if len(sizes) > 1:
        raise AccumulationError(
            f"every tensor of a batch must have the same first dimension (its rows); got {sorted(sizes)}."
        )
    return sizes.pop()


def split_batch(batch: Any, parts: int) -> list[tuple[Any, float]]:
    """``batch`` (a tensor, or a tuple, list or dict of them, nested) cut along dim 0 into ``parts`` pieces, each
    with its share of the rows (the weight of its mean loss); see :func:`partition`.

    Leaves that are not tensors (a flag, a list of file names of another length) are passed to every piece.
    """
    if parts == 1:
        return [(batch, 1.0)]
    try:
        rows = batch_rows(batch)
    except AccumulationError as exc:
        raise AccumulationError(f"trial.micro_batches(): {exc}") from None
    return [(take_rows(batch, lo, hi), share) for lo, hi, share in partition(rows, parts)]


def tensors_of(batch: Any) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, Mapping):
        return [t for v in batch.values() for t in tensors_of(v)]
    if isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        return [t for v in batch for t in tensors_of(v)]
    return []


def take_rows(batch: Any, lo: int, hi: int) -> Any:
    """Rows ``lo:hi`` of every tensor of a batch (views, not copies); other leaves as they are."""
    if isinstance(batch, torch.Tensor):
        return batch[lo:hi] if batch.dim() > 0 else batch
    if isinstance(batch, Mapping):
        items = {k: take_rows(v, lo, hi) for k, v in batch.items()}
        try:
            # dict, OrderedDict, transformers' BatchEncoding: a concrete mapping's class, built from one mapping
            return cast(Callable[[dict[Any, Any]], Any], type(batch))(items)
        except TypeError:
            return items
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(take_rows(v, lo, hi) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(take_rows(v, lo, hi) for v in batch)
    return batch


@dataclass
class MicroBatch:
    """Where ``micro_batches`` stands: which micro-batch, its share of the batch's rows, whether it was backed."""

    index: int
    count: int
    share: float
    backward_called: bool = False

    @property
    def last(self) -> bool:
        return self.index == self.count - 1
