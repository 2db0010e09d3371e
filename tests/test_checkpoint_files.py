"""Checkpoints on disk, without a sweep: each is flushed before it counts, the one before it stays until a newer
one's record is stored, and a damaged one (a shard cut short) is passed over for the one before it, then for the
start."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import torch

from optuna_saturn import checkpoint


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
    step, _ = checkpoint.load(_SingleProcess(), checkpoint.usable(latest), model, optimizer, None, group=None)
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
