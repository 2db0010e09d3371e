"""Gradient accumulation: one device's share of a batch, split into equal micro-batches.

The planner may run a trial with gradient accumulation when the whole per-device batch runs out of memory. The
global batch, the data order and (up to float rounding) the result stay the same; only activation memory shrinks,
and the step gets slower. The objective opts in by iterating ``trial.micro_batches(batch)``; splitting here, not in
the DataLoader, keeps every optimizer step seeing exactly the samples it would see without accumulation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


class AccumulationError(ValueError):
    """A batch cannot be split into the trial's micro-batches, or the objective does not split its batches."""


def split_batch(batch: Any, parts: int) -> list[tuple[Any, float]]:
    """``batch`` (a tensor, or a tuple, list or dict of them, nested) cut along dim 0 into ``parts`` pieces, each
    with its share of the rows (the weight of its mean loss). Pieces are equal when the rows divide evenly (the
    planner only picks such counts); a smaller last batch of an epoch is cut as evenly as it goes.

    Leaves that are not tensors (a flag, a list of file names of another length) are passed to every piece.
    """
    if parts == 1:
        return [(batch, 1.0)]
    sizes = {t.shape[0] for t in _tensors(batch) if t.dim() > 0}
    if not sizes:
        raise AccumulationError("trial.micro_batches() found no tensor with a batch dimension to split.")
    if len(sizes) > 1:
        raise AccumulationError(
            f"trial.micro_batches() needs every tensor of the batch to have the same first dimension; got {sorted(sizes)}."
        )
    (size,) = sizes
    if size < parts:
        raise AccumulationError(
            f"This trial accumulates gradients over {parts} micro-batches, but this device's batch has only {size} "
            f"row(s). Build the DataLoader with drop_last=True (a short last batch), use a larger batch, or remove "
            f"{parts} from the strategy's knobs.gradient_accumulation."
        )
    bounds = [round(i * size / parts) for i in range(parts + 1)]
    return [(_take(batch, lo, hi), (hi - lo) / size) for lo, hi in zip(bounds, bounds[1:])]


def _tensors(batch: Any) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, Mapping):
        return [t for v in batch.values() for t in _tensors(v)]
    if isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        return [t for v in batch for t in _tensors(v)]
    return []


def _take(batch: Any, lo: int, hi: int) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[lo:hi] if batch.dim() > 0 else batch
    if isinstance(batch, Mapping):
        items = {k: _take(v, lo, hi) for k, v in batch.items()}
        try:
            return type(batch)(items)  # dict, OrderedDict, transformers' BatchEncoding
        except TypeError:
            return items
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(_take(v, lo, hi) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(_take(v, lo, hi) for v in batch)
    return batch
