"""Checkpoints on disk, without a sweep: each is flushed before it counts, the one before it stays until a newer
one's record is stored, and a damaged one (a shard cut short) is passed over for the one before it, then for the
start."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import torch

from optuna_saturn.training import checkpoint


class _SingleProcess:
    context = SimpleNamespace(rank=0, world_size=1, strategy="single")
    checkpoint_format = checkpoint.DCP


def _trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(16, 8)).square().mean().backward()
    optimizer.step()
    return model, optimizer


def _save(folder: Path, step: int, seed: int) -> tuple[checkpoint.CheckpointRecord, dict]:
    model, optimizer = _trained(seed)
    record = checkpoint.save(_SingleProcess(), folder, step, model, optimizer, None, group=None)
    checkpoint.prune(record)
    return record, {k: v.clone() for k, v in model.state_dict().items()}


def _cut_short(record: checkpoint.CheckpointRecord) -> None:
    shard = max((p for p in Path(record.path).rglob("*.distcp")), key=lambda p: p.stat().st_size)
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)


def test_a_damaged_checkpoint_falls_back_to_the_one_before_then_to_the_start(tmp_path):
    folder = tmp_path / "trial-0"
    first, first_weights = _save(folder, 4, seed=1)
    latest, _ = _save(folder, 8, seed=2)
    assert checkpoint.usable(latest) == latest

    _cut_short(latest)
    assert checkpoint.usable(latest) == first
    model, optimizer = _trained(seed=3)
    step, _, _ = checkpoint.load(_SingleProcess(), checkpoint.usable(latest), model, optimizer, None, group=None)
    assert step == 4
    assert all(torch.equal(model.state_dict()[k], v) for k, v in first_weights.items())

    _cut_short(first)
    assert checkpoint.usable(latest) is None


def test_the_checkpoint_before_the_latest_stays_and_older_ones_go(tmp_path):
    folder = tmp_path / "trial-0"
    for step in (4, 8, 12):
        _save(folder, step, seed=step)
    assert sorted(p.name for p in folder.iterdir()) == ["step-12", "step-8"]
    assert not list(folder.glob("*.partial"))


def test_every_file_of_a_checkpoint_is_flushed_before_it_is_renamed(tmp_path, monkeypatch):
    synced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    record, _ = _save(tmp_path / "trial-0", 4, seed=1)
    partial = str(tmp_path / "trial-0" / "step-4.partial")
    written = {str(Path(partial) / p.relative_to(record.path)) for p in Path(record.path).rglob("*")}
    assert written <= set(synced)  # every file and folder, under its temporary name
    assert partial in synced and str(tmp_path / "trial-0") in synced  # and the rename itself


def test_the_trainer_state_is_kept_as_json_and_comes_back_as_it_was(tmp_path):
    """The step, the scheduler, the random generators: JSON in the checkpoint (nothing of it is unpickled), and
    the run resumed draws the same numbers and follows the same schedule."""
    import json
    import random

    import numpy

    from optuna_saturn.training import trainer_state

    model, optimizer = _trained(0)
    scheduler = torch.optim.lr_scheduler.SequentialLR(
        optimizer,
        [
            torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=3),
            torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10),
        ],
        milestones=[3],
    )
    for _ in range(4):
        optimizer.step()
        scheduler.step()
    record = checkpoint.save(_SingleProcess(), tmp_path, 4, model, optimizer, scheduler, group=None)
    expected = (
        torch.rand(3),
        random.random(),
        numpy.random.rand(),
        [scheduler.step() or scheduler.get_last_lr() for _ in range(3)],
    )
    fresh_model, fresh_optimizer = _trained(1)
    fresh = torch.optim.lr_scheduler.SequentialLR(
        fresh_optimizer,
        [
            torch.optim.lr_scheduler.LinearLR(fresh_optimizer, start_factor=0.1, total_iters=3),
            torch.optim.lr_scheduler.CosineAnnealingLR(fresh_optimizer, T_max=10),
        ],
        milestones=[3],
    )
    step, _, _ = checkpoint.load(_SingleProcess(), record, fresh_model, fresh_optimizer, fresh, group=None)
    again = (
        torch.rand(3),
        random.random(),
        numpy.random.rand(),
        [fresh.step() or fresh.get_last_lr() for _ in range(3)],
    )
    assert step == 4 and torch.equal(expected[0], again[0]) and expected[1:] == again[1:]

    blob = trainer_state.dumps({"random": {"torch": torch.get_rng_state(), "numpy": numpy.random.get_state()}})
    assert json.loads(blob)  # plain JSON
    import pickle

    import pytest

    with pytest.raises(ValueError, match="not JSON"):
        trainer_state.loads(pickle.dumps({"step": 1}))
    with pytest.raises(ValueError, match="names no tensor type"):
        trainer_state.loads(b'{"__tensor__": ["load", [1], ""]}')
    with pytest.raises(TypeError, match=r"state\['scheduler'\]\[0\] is a function"):
        trainer_state.dumps({"scheduler": [lambda step: 1.0]})


def test_a_pass_closed_after_the_next_one_began_leaves_the_next_ones_position():
    """Lightning makes an epoch's iterator before it drops the last epoch's: closing the old pass then must not
    mark the new one ended (a checkpoint in the new epoch then saved "between passes", and the resumed run trained
    on the epoch's first batches again)."""
    import gc

    from optuna_saturn.training.loader_positions import PositionedLoader

    loader = PositionedLoader(torch.utils.data.DataLoader(list(range(8)), batch_size=2))
    first = iter(loader)
    assert [int(next(first)[0]) for _ in range(4)] == [0, 2, 4, 6]  # (every batch, not yet told it ended)
    second = iter(loader)
    next(second)
    del first
    gc.collect()
    assert loader.position()["yielded"] == 1
