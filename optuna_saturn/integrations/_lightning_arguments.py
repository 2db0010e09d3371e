"""What ``trial.lightning_trainer(**kwargs)`` does with a script's Trainer arguments: the ones the sweep decides are
checked (every conflict reported at once, each with its fix), checkpoint callbacks turn Lightning's checkpointing
on, and each trial's logs go to folders of its own (concurrent trials in one ``CSVLogger("logs")`` would share,
and race for, its ``version_N`` folders)."""

from __future__ import annotations

import os
from typing import Any

#: Trainer arguments the trial decides; the user may pass only these values, which mean "as the trial says".
FOLLOWS_THE_TRIAL = {
    "strategy": ("auto",),
    "devices": ("auto", 1, "1", [0]),
    "num_nodes": (1,),
    "precision": (None, 32, "32", "32-true", "bf16-mixed", "bf16", "16-mixed", 16, "16"),
    "plugins": (None, [], ()),
}

_FIXES = {
    "strategy": "list the strategies the sweep may use with SaturnExecutor(strategies=[...]) instead",
    "devices": "each of the trial's processes drives one device; the sweep picks how many",
    "num_nodes": "the sweep places the trial's processes",
    "precision": "optuna-saturn runs 'bf16-mixed' and '16-mixed' (autocast) under every strategy, and float32; a "
    "whole model in half precision ('-true') is a strategy's own business",
    "plugins": "the trial's strategy sets up the process group and the devices",
}


def refuse_conflicts(kwargs: dict[str, Any], *, runs_as: str, device_type: str | None) -> None:
    """Trainer arguments that would pick a strategy, devices or precision behind the trial's back: one error that
    names every one, each with its fix (the strategy and the device count are the sweep's choice for each trial).
    Also run when the trial is described, before anything is launched (``device_type`` None: not known yet)."""
    problems = [
        f"{name}={kwargs[name]!r}: remove it; {_FIXES[name]}"
        for name, allowed in FOLLOWS_THE_TRIAL.items()
        if name in kwargs and kwargs[name] not in allowed
    ]
    accelerator = kwargs.get("accelerator", "auto")
    wanted = {"cuda": ("auto", "gpu", "cuda"), "cpu": ("auto", "cpu")}.get(
        device_type or "", ("auto", "cpu", "gpu", "cuda")
    )
    if accelerator not in wanted:
        on = f" (this trial runs on {device_type})" if device_type else ""
        problems.append(f"accelerator={accelerator!r}: remove it; the trial's devices decide{on}")
    if kwargs.get("use_distributed_sampler"):
        problems.append(
            "use_distributed_sampler=True: remove it; each rank gets its rows of every global batch from "
            "optuna-saturn, so that the trial trains on the same data under every strategy, where Lightning's "
            "DistributedSampler would give each rank a whole batch"
        )
    if problems:
        listed = "".join(f"\n  - {p}" for p in problems)
        raise ValueError(f"trial.lightning_trainer(...): {runs_as}. Change these arguments:{listed}")


def wants_checkpoints(kwargs: dict[str, Any]) -> bool:
    """Lightning's own checkpointing stays off in a trial (the trial checkpoints through ``trial.checkpoint``),
    unless the script asks for it: ``enable_checkpointing=True``, or a ``ModelCheckpoint`` among its callbacks
    (which Lightning refuses beside ``enable_checkpointing=False``, a setting the script never made)."""
    from lightning.pytorch.callbacks import Checkpoint

    if "enable_checkpointing" in kwargs:
        return bool(kwargs["enable_checkpointing"])
    return any(isinstance(c, Checkpoint) for c in as_list(kwargs.get("callbacks")))


def own_folders(kwargs: dict[str, Any], run: str) -> None:
    """``default_root_dir`` becomes ``<default_root_dir>/<run>``, each logger that would number its own versions
    (CSV, TensorBoard) writes to ``<its folder>/<its name>/<run>``, and a ``ModelCheckpoint`` given a ``dirpath``
    saves in ``<dirpath>/<run>``: one folder per trial, and per profiling run, never shared."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    kwargs["default_root_dir"] = os.path.join(kwargs.get("default_root_dir") or "lightning_logs", run)
    for callback in as_list(kwargs.get("callbacks")):
        if isinstance(callback, ModelCheckpoint) and callback.dirpath is not None:
            callback.dirpath = os.path.join(callback.dirpath, run)
    loggers = kwargs.get("logger")
    for logger in as_list(loggers) if loggers not in (None, True, False) else []:
        if hasattr(logger, "_version") and getattr(logger, "_version", None) is None:
            logger._version = run


def as_list(values: Any) -> list:
    if values is None:
        return []
    return list(values) if isinstance(values, (list, tuple)) else [values]
