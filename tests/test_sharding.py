"""Each rank's part of the user's batches, checked with two real processes (gloo, rendezvous through a file, on
loopback only): the ranks' rows of every global batch are exactly the batch one process would get."""

from __future__ import annotations

import os
import random
import traceback

import numpy
import objectives
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from optuna_saturn.training.sharding import ShardedDataLoader, ShardingError

WORLD = 2


def _rows(n: int = 13) -> TensorDataset:
    return TensorDataset(torch.arange(n), torch.arange(n) * 10)


def _map_random() -> DataLoader:  # RandomSampler drawing from the global generator
    return DataLoader(_rows(), batch_size=4, shuffle=True)


def _weighted_generator() -> DataLoader:
    sampler = torch.utils.data.WeightedRandomSampler(
        [0.0, 1.0] * 6 + [5.0], num_samples=11, generator=torch.Generator().manual_seed(7)
    )
    return DataLoader(_rows(), batch_size=4, sampler=sampler)


def _subset_random() -> DataLoader:  # a training split: only even rows, in a random order
    return DataLoader(_rows(), batch_size=3, sampler=torch.utils.data.SubsetRandomSampler(range(0, 13, 2)))


def _custom_numpy_sampler() -> DataLoader:
    class NumpyShuffle(torch.utils.data.Sampler):
        def __iter__(self):
            return iter(numpy.random.permutation(13).tolist())

        def __len__(self):
            return 13

    return DataLoader(_rows(), batch_size=5, sampler=NumpyShuffle())


def _iterable_dicts() -> DataLoader:
    return DataLoader(objectives.RegressionStream(), batch_size=16)


def _collate_with_names(samples):
    return {"i": torch.stack([s[0] for s in samples]), "names": [f"row{int(s[0])}" for s in samples]}


def _workers_and_collate() -> DataLoader:
    return DataLoader(
        _rows(), batch_size=4, shuffle=True, num_workers=2, collate_fn=_collate_with_names, persistent_workers=True
    )


LOADERS = {
    "random": _map_random,
    "weighted-generator": _weighted_generator,
    "subset": _subset_random,
    "numpy-sampler": _custom_numpy_sampler,
    "iterable": _iterable_dicts,
    "workers-collate": _workers_and_collate,
}


def _ids(batch):
    """A batch's row identities, whatever its structure."""
    if isinstance(batch, dict):
        return batch["i"].tolist(), batch["names"]
    if isinstance(batch, (list, tuple)):
        return batch[0].tolist() if batch[0].dim() == 1 else batch[0][:, 0].tolist()
    return batch.tolist()


def _epochs(loader, epochs: int = 2):
    out = []
    for _ in range(epochs):
        out.append([_ids(b) for b in loader])
    return out


def _rank_main(rank: int, init_file: str, name: str, results) -> None:
    try:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
        # Each rank seeds differently: the loaders must still agree on every global batch.
        torch.manual_seed(100 + rank)
        numpy.random.seed(100 + rank)
        random.seed(100 + rank)
        seen = []
        loader = ShardedDataLoader(
            LOADERS[name](), rank=rank, world_size=WORLD, group=dist.group.WORLD, on_batch=seen.append
        )
        batches = _epochs(loader)
        results.put(
            (
                rank,
                len(loader) if name != "iterable" else None,
                batches,
                [(s.start, s.stop, s.rows, s.weight, s.repeated) for s in seen],
            )
        )
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        results.put((rank, "error", traceback.format_exc(), None))


def _sharded(name: str, tmp_path):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, str(tmp_path / "init"), name, results)) for r in range(WORLD)]
    for p in procs:
        p.start()
    got = sorted((results.get(timeout=120) for _ in procs), key=lambda r: r[0])
    for p in procs:
        p.join(timeout=60)
    for _rank, length, batches, _ in got:
        assert length != "error", batches
    return got


@pytest.mark.parametrize("name", list(LOADERS))
def test_ranks_split_exactly_the_batches_one_process_would_get(name, tmp_path):
    got = _sharded(name, tmp_path)
    torch.manual_seed(100)  # rank 0's seed: rank 0 draws exactly as one process would
    numpy.random.seed(100)
    random.seed(100)
    single = _epochs(LOADERS[name]())
    (_, length0, batches0, shares0), (_, _, batches1, shares1) = got
    if length0 is not None:
        assert length0 == len(LOADERS[name]())  # len() counts global batches, as the user's loader does
    for epoch, (whole, part0, part1) in enumerate(zip(single, batches0, batches1)):
        assert len(part0) == len(part1) == len(whole), f"epoch {epoch}: every rank takes part in every batch"
        for _b, (rows, mine0, mine1) in enumerate(zip(whole, part0, part1)):
            if isinstance(rows, tuple):  # ids and names from a collate_fn
                rows, mine0, mine1 = rows[0], mine0[0], mine1[0]
            n = len(rows)
            if n >= WORLD:
                assert mine0 + mine1 == rows  # in order, nothing padded, nothing dropped
                assert abs(len(mine0) - len(mine1)) <= 1
            else:  # one row for two ranks: rank 1 repeats it, and says so
                assert mine0 == mine1 == rows
    assert single[0] != single[1] or name in ("subset",) or len(single[0]) == 1  # shuffled anew each epoch
    for s0, s1 in zip(shares0, shares1):
        assert s0[3] + s1[3] == pytest.approx(WORLD)  # the weights average to one: the whole batch's gradient
        assert s1[4] == (s0[2] < WORLD)


def test_a_distributed_sampler_and_unbatched_loaders_are_refused_with_the_fix():
    data = _rows()
    with pytest.raises(ShardingError, match="build the DataLoader as for one process"):
        ShardedDataLoader(
            DataLoader(data, batch_size=4, sampler=DistributedSampler(data, num_replicas=2, rank=0)),
            rank=0,
            world_size=2,
            group=None,
            on_batch=print,
        )
    with pytest.raises(ShardingError, match="Give it a batch_size"):
        ShardedDataLoader(DataLoader(data, batch_size=None), rank=0, world_size=2, group=None, on_batch=print)
    with pytest.raises(ShardingError, match="in_order=True"):
        ShardedDataLoader(
            DataLoader(data, batch_size=2, num_workers=1, in_order=False),
            rank=0,
            world_size=2,
            group=None,
            on_batch=print,
        )
