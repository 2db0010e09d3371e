"""A trial's checkpoints: its training state on disk, so that a trial run again after its sweep died resumes where
the first run stopped instead of from scratch.

What is saved: the model, the optimizer, the LR scheduler, the random generators (rank 0's, as every rank draws
from them alike: see :mod:`optuna_saturn.training.sharding`), where each prepared DataLoader's pass stands
(:mod:`optuna_saturn.training.loader_positions`: a run resumed mid-epoch trains on the batches the first run
would have) and the step. Where: one folder per trial, ``step-<k>`` in it, written under a temporary name, flushed to
disk
(``fsync``) and renamed when complete, so a checkpoint that a kill or a power loss cut short is never taken for
one. Its record (:class:`CheckpointRecord`) is the trial's ``saturn:checkpoint`` user attribute; the checkpoint
before it is removed only once the executor has stored that record (:func:`prune`), and the one before that
stays, so a checkpoint found damaged when it is loaded (its files are not as they were written: the record
lists their sizes) falls back to the one before it (:func:`usable`), then to the start.

Two formats; each engine declares its own and which checkpoints it can resume
(:class:`~optuna_saturn.strategy.engine_traits.EngineTraits`):

- **torch.distributed.checkpoint** (single, DDP, FSDP): every rank writes its shards, each tensor under its
  parameter's name (``get_state_dict`` strips DDP's and FSDP's wrappers), and loading reshards: a checkpoint saved
  by FSDP on 2 ranks loads into one process, or DDP on 4, and the other way round. So a retried trial may be
  planned on any of these options, whatever its first run used.
- **DeepSpeed's own checkpoint** (ZeRO): ``engine.save_checkpoint``, whose optimizer partitions belong to the world
  size that wrote them. A run on as many ranks loads it as it is; a run of the same strategy on another number
  of ranks loads it through DeepSpeed's *universal checkpoint*: rank 0 converts it once
  (``deepspeed.checkpoint.ds_to_universal``, into ``step-<k>/state_universal``, which reshards every parameter
  and its optimizer state), and the engine loads that (``load_universal_checkpoint``). Which options may load
  which checkpoint: :func:`can_resume`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from optuna_saturn.strategy.engine_registry import traits_of
from optuna_saturn.strategy.engine_traits import DCP as DCP  # (engines and tests name it here)
from optuna_saturn.strategy.engine_traits import DEEPSPEED
from optuna_saturn.training import trainer_state
from optuna_saturn.training.checkpoint_paths import make_private_folders, refusal
from optuna_saturn.training.engine_protocol import TrainingEngine
from optuna_saturn.training.random_state import capture, restore

_RECORD_FILE = "saturn-checkpoint.json"
_TAG = "state"  # DeepSpeed's tag: its files go in step-<k>/state/
_UNIVERSAL_TAG = "state_universal"  # the same, converted to DeepSpeed's universal checkpoint
_CONVERTED = "converted"  # the marker of a complete conversion


@dataclass(frozen=True)
class CheckpointRecord:
    """A complete checkpoint: where it is, the steps it holds, and what wrote it."""

    path: str
    step: int
    format: str
    strategy: str
    world_size: int
    saved_at: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> CheckpointRecord:
        return cls(
            str(data["path"]),
            int(data["step"]),
            str(data["format"]),
            str(data["strategy"]),
            int(data["world_size"]),
            float(data["saved_at"]),
        )


def can_resume(record: CheckpointRecord, engine_name: str, world_size: int, strategy: str | None = None) -> bool:
    """Whether a run under this engine, world size and strategy can load ``record``, as the engine says: any run
    of the reshardable format's; a DeepSpeed run on as many ranks as wrote its partitions, or of the same strategy
    (the same ZeRO stage) on any number of ranks, through the universal checkpoint."""
    return traits_of(engine_name).can_resume(record, world_size, strategy)


def exists(record: CheckpointRecord) -> bool:
    return exists_at(record.path)


def exists_at(path: str) -> bool:
    """Whether a complete checkpoint is at ``path`` (a record's)."""
    return (Path(path) / _RECORD_FILE).is_file()


def save(
    engine: TrainingEngine,
    folder: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: Any,
    scheduler: Any,
    *,
    group: Any,
    loaders: Sequence[Any] = (),
    extra: dict[str, Any] | None = None,
) -> CheckpointRecord:
    """Save the training state at ``step`` in ``folder`` (collective: every rank calls it), with ``loaders``
    (where each prepared loader's pass stands, :mod:`optuna_saturn.training.loader_positions`) and ``extra`` (a
    framework's own loop state, rank 0's, kept as JSON: Lightning's loops and callbacks). Returns the record, on
    every rank; older checkpoints of the trial are removed once this one is complete."""
    context = engine.context
    fmt = engine.checkpoint_format
    final = folder / f"step-{step}"
    partial = folder / f"step-{step}.partial"
    if context.rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        make_private_folders(partial)  # (0700 whatever the umask: a resume refuses folders others can change)
    trainer = _trainer_state(step, scheduler, list(loaders), context.world_size, group, extra)
    _barrier(context.world_size, group)  # the folder exists for every rank
    if fmt == DEEPSPEED:
        deepspeed_engine: Any = model  # (a DeepSpeedEngine: deepspeed has no types)
        deepspeed_engine.save_checkpoint(str(partial), tag=_TAG, client_state={"saturn": trainer})
    else:
        import torch.distributed.checkpoint as dcp

        dcp.save(_dcp_state(model, optimizer, trainer), checkpoint_id=str(partial), process_group=_dcp_group(group))
    _barrier(context.world_size, group)  # every rank's part is written
    record = CheckpointRecord(str(final.resolve()), int(step), fmt, context.strategy, context.world_size, time.time())
    if context.rank == 0:
        files = {str(f.relative_to(partial)): f.stat().st_size for f in sorted(partial.rglob("*")) if f.is_file()}
        (partial / _RECORD_FILE).write_text(json.dumps({**record.to_json(), "files": files}), encoding="utf-8")
        _flush(partial)
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        _flush_folder(folder)
    _barrier(context.world_size, group)
    return record


def prune(record: CheckpointRecord) -> None:
    """Remove the trial's checkpoints older than the one before ``record``, once the executor stored ``record``
    (a crash before that finds the one before in the trial's attribute, still on disk)."""
    newest_first = sorted(_steps(Path(record.path).parent), key=lambda r: -r.step)
    before = [r for r in newest_first if r.step < record.step]
    for older in before[1:]:
        shutil.rmtree(older.path, ignore_errors=True)


def usable(record: CheckpointRecord) -> CheckpointRecord | None:
    """``record`` if its files are as they were written, else the newest intact checkpoint before it in its
    trial's folder; None if there is none. (Every rank finds the same one: they read the same files.)"""
    candidates = [
        record,
        *sorted((r for r in _steps(Path(record.path).parent) if r.step < record.step), key=lambda r: -r.step),
    ]
    return next((r for r in candidates if _intact(Path(r.path))), None)


def resumable(record: CheckpointRecord, checkpoint_dir: str | None, *, say: bool) -> CheckpointRecord | None:
    """The checkpoint a run of ``checkpoint_dir``'s trial resumes from: ``record``, or the newest intact one before
    it when it is damaged; None when none is, or when ``record`` lies outside this sweep's checkpoint folder
    (checked again here, just before loading: the executor checked when it planned). ``say``: tell the user why
    (rank 0 does, once)."""
    root = os.path.dirname(checkpoint_dir) if checkpoint_dir else ""
    refused = refusal(record.path, root) if root else "this run has no checkpoint folder"
    if refused:
        if say:
            print(f"optuna-saturn: not loading {record.path} ({refused}); starting from step 0.", file=sys.stderr)
        return None
    found = usable(record)
    if found != record and say:
        print(
            f"optuna-saturn: the checkpoint at step {record.step} ({record.path}) is damaged: "
            + (f"resuming from step {found.step} instead." if found else "starting from step 0."),
            file=sys.stderr,
            flush=True,
        )
    return found


def _steps(folder: Path) -> list[CheckpointRecord]:
    """The complete checkpoints in a trial's folder."""
    found = []
    for step in folder.glob("step-*"):
        try:
            found.append(CheckpointRecord.from_json(json.loads((step / _RECORD_FILE).read_text(encoding="utf-8"))))
        except (OSError, ValueError, KeyError):
            continue  # (a partial one, or not a checkpoint)
    return found


def _intact(path: Path) -> bool:
    """Whether the checkpoint's files are all there, each of the size it was written with."""
    try:
        files = json.loads((path / _RECORD_FILE).read_text(encoding="utf-8")).get("files")
        return files is not None and all((path / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError):
        return False


def _flush(folder: Path) -> None:
    """``fsync`` every file and folder under ``folder``, and ``folder`` itself."""
    for path in sorted(folder.rglob("*"), key=lambda p: -len(p.parts)):
        if path.is_file():
            _fsync(path, os.O_RDONLY)
        elif path.is_dir():
            _flush_folder(path)
    _flush_folder(folder)


def _flush_folder(folder: Path) -> None:
    _fsync(folder, os.O_RDONLY | os.O_DIRECTORY)


def _fsync(path: Path, flags: int) -> None:
    descriptor = os.open(path, flags)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def load(
    engine: TrainingEngine,
    record: CheckpointRecord,
    model: torch.nn.Module,
    optimizer: Any,
    scheduler: Any,
    *,
    group: Any,
) -> tuple[int, list[Any], dict[str, Any] | None]:
    """Load ``record`` into the prepared model, optimizer and scheduler, and the random generators; returns its
    step, the loaders' positions and the ``extra`` state it saved. Collective."""
    if record.format == DEEPSPEED:
        trainer = _load_deepspeed(engine, record, model, optimizer, group)
    else:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = _dcp_state(model, optimizer, b"")
        dcp.load(state, checkpoint_id=record.path, process_group=_dcp_group(group))
        set_state_dict(
            model,
            [] if optimizer is None else [optimizer],
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"] if optimizer is not None else {},
        )
        trainer = state["trainer"]
    saved = trainer_state.loads(trainer)
    if scheduler is not None and saved["scheduler"] is not None:
        scheduler.load_state_dict(saved["scheduler"])
    restore(saved["random"])
    return int(saved["step"]), list(saved.get("loaders", [])), saved.get("extra")


def _load_deepspeed(engine: TrainingEngine, record: CheckpointRecord, model: Any, optimizer: Any, group: Any) -> bytes:
    """DeepSpeed's checkpoint into the engine ``model``: as it is on as many ranks, else as a universal
    checkpoint (converted once, by rank 0)."""
    context = engine.context
    tag = _TAG
    if record.world_size != context.world_size:
        tag = _UNIVERSAL_TAG
        universal = Path(record.path) / _UNIVERSAL_TAG
        if context.rank == 0 and not (universal / _CONVERTED).is_file():
            to_universal(Path(record.path) / _TAG, universal)
        _barrier(context.world_size, group)
        model._config.load_universal_checkpoint = True  # (read by load_checkpoint alone)
    try:
        _, client = model.load_checkpoint(
            record.path, tag=tag, load_optimizer_states=optimizer is not None, load_lr_scheduler_states=False
        )
    finally:
        model._config.load_universal_checkpoint = False
    trainer: bytes = (client or {})["saturn"]  # (what save() gave DeepSpeed as its client state)
    return trainer


def to_universal(source: Path, target: Path) -> None:
    """Convert DeepSpeed's ZeRO checkpoint in ``source`` (one tag's folder) into a universal checkpoint in
    ``target``, which any number of ranks of the same ZeRO stage loads. ``inject_missing_state``: a model that
    is not Megatron's has no tensor-parallel layout to describe; DeepSpeed then assumes none."""
    import argparse
    import contextlib
    import io

    from deepspeed.checkpoint import ds_to_universal

    shutil.rmtree(target, ignore_errors=True)
    args = argparse.Namespace(
        input_folder=str(source),
        output_folder=str(target),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,
    )
    with contextlib.redirect_stdout(io.StringIO()):  # (it prints every parameter it converts)
        ds_to_universal.main(args)
    (target / _CONVERTED).write_text(str(time.time()), encoding="utf-8")


def remove(path: str | Path) -> None:
    """A trial's checkpoint folder, once nothing will resume from it."""
    shutil.rmtree(path, ignore_errors=True)


def _dcp_state(model: torch.nn.Module, optimizer: Any, trainer: bytes) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, [] if optimizer is None else [optimizer])
    return {"model": model_state, "optimizer": optim_state if optimizer is not None else {}, "trainer": trainer}


def _dcp_group(group: Any) -> Any:
    return group if dist.is_available() and dist.is_initialized() else None


def _trainer_state(
    step: int, scheduler: Any, loaders: list[Any], world_size: int, group: Any, extra: dict[str, Any] | None = None
) -> bytes:
    """The step, the scheduler, rank 0's random generators and its loaders' positions, as one blob that every
    rank holds alike (the checkpoint keeps one copy of what is not a tensor)."""
    blob: list[Any] = [None]
    if world_size == 1 or dist.get_rank(group) == 0:
        try:
            blob = [
                trainer_state.dumps(
                    {
                        "step": int(step),
                        "scheduler": None if scheduler is None else scheduler.state_dict(),
                        "random": capture(cuda=True),
                        "loaders": loaders,
                        "extra": extra,
                    }
                )
            ]
        except (TypeError, ValueError) as exc:  # every rank raises it, not rank 0 alone (the others would wait)
            blob = [exc]
    if world_size > 1:
        dist.broadcast_object_list(blob, src=0, group=group)
    if isinstance(blob[0], Exception):
        raise blob[0]
    trainer: bytes = blob[0]  # (trainer_state.dumps's blob, rank 0's on every rank)
    return trainer


def _barrier(world_size: int, group: Any) -> None:
    if world_size > 1:
        dist.barrier(group=group)
