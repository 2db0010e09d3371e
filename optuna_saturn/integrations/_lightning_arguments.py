"""What ``trial.lightning_trainer(**kwargs)`` does with a script's Trainer arguments: the ones the sweep decides are
checked (every conflict reported at once, each with its fix), checkpoint callbacks turn Lightning's checkpointing
on, and each trial's files go to folders of its own.

The folders, as Lightning itself would keep them across runs:

- per study and trial (``<study>-trial-<N>``): concurrent trials in one ``CSVLogger("logs")`` would share, and race
  for, its ``version_N`` folders, and three studies run from one folder would all write ``trial-0``;
- a run that goes on from the trial's checkpoint (moved to another strategy, or run again after a crash) appends
  to the trial's CSV history, where Lightning would delete it ("Previous log files in this directory will be
  deleted"): every epoch stays;
- a profiling run (a few timed steps, not the trial) writes its logs and checkpoints into a private temporary
  folder, removed with its Trainer: nothing in the user's folders.
"""

from __future__ import annotations

import csv
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


def own_folders(kwargs: dict[str, Any], run: str, *, resumes: bool = False, private: str | None = None) -> None:
    """``default_root_dir`` becomes ``<default_root_dir>/<run>``, each logger that would number its own versions
    (CSV, TensorBoard) writes to ``<its folder>/<its name>/<run>``, and a ``ModelCheckpoint`` given a ``dirpath``
    saves in ``<dirpath>/<run>``: one folder per trial, never shared. ``resumes``: the run goes on from the trial's
    checkpoint, on rank 0 (its CSV loggers then append to the trial's history); ``private``: a folder that takes the
    place of every folder of the user's (a profiling run's)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    root = private or kwargs.get("default_root_dir") or "lightning_logs"
    kwargs["default_root_dir"] = os.path.join(root, run)
    for callback in as_list(kwargs.get("callbacks")):
        if isinstance(callback, ModelCheckpoint) and callback.dirpath is not None:
            callback.dirpath = os.path.join(private or callback.dirpath, run)
    loggers = kwargs.get("logger")
    for logger in as_list(loggers) if loggers not in (None, True, False) else []:
        if private is not None and hasattr(logger, "_root_dir"):
            logger._root_dir = private
        if hasattr(logger, "_version") and getattr(logger, "_version", None) is None:
            logger._version = run
        if resumes and private is None:
            _append_to_history(logger)


def _append_to_history(logger: Any) -> None:
    """A CSV logger whose run goes on from a checkpoint appends its metrics to the file its earlier runs wrote,
    under the same columns, where Lightning would delete that file. Set up on rank 0 only: Lightning's
    experiment writer is rank 0's (``rank_zero_experiment``), and another rank's would write the file too."""
    from lightning.pytorch.loggers import CSVLogger
    from lightning.pytorch.loggers.csv_logs import ExperimentWriter

    if not isinstance(logger, CSVLogger) or logger._experiment is not None:
        return

    class _History(ExperimentWriter):
        def _check_log_dir_exists(self) -> None:
            if os.path.isfile(self.metrics_file_path):  # (its columns, so that appending rewrites nothing)
                with open(self.metrics_file_path, newline="") as f:
                    self.metrics_keys = sorted(next(csv.reader(f), []))

    os.makedirs(logger.root_dir, exist_ok=True)
    logger._experiment = _History(log_dir=logger.log_dir)


def as_list(values: Any) -> list:
    if values is None:
        return []
    return list(values) if isinstance(values, (list, tuple)) else [values]
