"""The sizes of DeepSpeed ZeRO's communication buffers, where the strategy does not set them.

DeepSpeed's defaults are fixed numbers of elements, whatever the model and the device, and they are large. What
DeepSpeed 0.19.8 allocates with them (``runtime/zero/stage_1_and_2.py``, ``stage3.py``):

- ZeRO-1/2: gradients are copied into a reduce bucket of ``reduce_bucket_size`` elements (default 5e8) in the
  gradients' dtype, float32 at most (``setup_buckets``); with ``overlap_comm`` (on in our ``zero1``/``zero2``, as DDP
  overlaps) a second one, so the next bucket fills while the first is reduced: 2 x 5e8 x 4 B = 4 GB on every device,
  as much for a 100 M-parameter model as for a 10 B one. A gradient larger than the bucket skips it
  (``extra_large_param_to_reduce``), so the bucket need not hold the largest parameter. ``allgather_bucket_size``
  allocates nothing where ``all_gather_into_tensor`` exists (every torch we support): it is left alone.
- ZeRO-3: one reduce bucket per gradient dtype, also skipped by a larger gradient; ``stage3_prefetch_bucket_size``
  bounds the parameters gathered ahead of their use, ``stage3_max_live_parameters`` those kept gathered, and
  parameters under ``stage3_param_persistence_threshold`` are never partitioned.

The rules:

- ZeRO-3 (offered for models that fit only when sharded, so its memory must be about the shard's): Hugging Face's
  ``"auto"`` values, from the hidden size ``h``: buckets of ``h**2`` elements, prefetch of ``0.9 h**2``, persistence
  under ``10 h``; gathered parameters live up to a shard's worth, at least two buckets'. ``h`` is not the largest
  parameter: in a language model that is the embedding (Llama 3 8B: 128,256 x 4,096 = 525 M elements, a 2 GB
  float32 bucket). It is the size most of the parameters' dimensions share (each block's norms, the projections'
  inputs), read from the parameters so that any model has one.
- ZeRO-1/2: the reduce buckets (two with ``overlap_comm``) take at most 1/64 of the device's memory (1.25 GB of an
  80 GB GPU: NCCL reaches its bandwidth with buckets far smaller, DDP's are 25 MB), and none is larger than the
  model's gradients (one bucket then holds them all).

Neither is ever larger than DeepSpeed's own default.
"""

from __future__ import annotations

from collections import Counter

import torch

#: DeepSpeed 0.19.8's defaults (``runtime/zero/config.py``, ``stage3.py``): never exceeded.
DEEPSPEED_REDUCE_BUCKET = 500_000_000
DEEPSPEED_PREFETCH_BUCKET = 50_000_000
DEEPSPEED_MAX_LIVE = 1_000_000_000
#: The share of a device's memory ZeRO-1/2's reduce buckets may take, all together.
BUCKETS_SHARE_OF_DEVICE_MEMORY = 1 / 64
#: Bytes of a bucket's element, at most (DeepSpeed reduces float32 gradients in float32).
BUCKET_ELEMENT_BYTES = 4


def hidden_size(model: torch.nn.Module) -> int:
    """The size most of the parameters' dimensions share (see the module's docstring); 0 without parameters."""
    sizes: Counter[int] = Counter()
    for p in model.parameters():
        sizes.update(d for d in p.shape if d > 1)
    return max(sizes, key=lambda d: (sizes[d], d)) if sizes else 0


def size_buckets(model: torch.nn.Module, zero: dict, *, world_size: int, device_memory: int | None) -> None:
    """Set in ``zero`` (the ``zero_optimization`` section) the bucket sizes the strategy leaves unset, by the rules
    of the module's docstring. ``device_memory``: the device's memory in bytes (None: no bound from it)."""
    total = sum(p.numel() for p in model.parameters())
    if not total:
        return
    if int(zero.get("stage", 0)) >= 3:
        h = hidden_size(model)
        bucket = min(h * h, DEEPSPEED_REDUCE_BUCKET)
        live = int(min(DEEPSPEED_MAX_LIVE, max(2 * bucket, total // world_size)))
        zero.setdefault("reduce_bucket_size", bucket)
        zero.setdefault("stage3_prefetch_bucket_size", min(int(0.9 * bucket), DEEPSPEED_PREFETCH_BUCKET))
        zero.setdefault("stage3_param_persistence_threshold", 10 * h)
        zero.setdefault("stage3_max_live_parameters", live)
        zero.setdefault("stage3_max_reuse_distance", live)
        return
    bucket = min(total, DEEPSPEED_REDUCE_BUCKET)
    if device_memory:
        buffers = 2 if zero.get("overlap_comm") else 1
        bucket = min(bucket, int(device_memory * BUCKETS_SHARE_OF_DEVICE_MEMORY) // (buffers * BUCKET_ELEMENT_BYTES))
    zero.setdefault("reduce_bucket_size", max(bucket, 1))


def device_memory_of(device: torch.device) -> int | None:
    """A GPU's memory in bytes (this worker sees its GPU); None for a CPU device (its share of RAM is the
    planner's figure, not known here: the buckets are then bounded by the model alone)."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.get_device_properties(device).total_memory)
