"""Where a trial's next run starts from: the checkpoint a run before it left, if any option can load it.

A trial run again (its sweep died, a rank died, it was moved, its option failed after it saved) resumes from its
latest checkpoint under the options that can load it (``torch.distributed.checkpoint`` reshards; DeepSpeed's
loads into its own ZeRO stage, through a universal checkpoint on another device count). If none can, or the
checkpoint is gone, it runs from the start. Written into :attr:`SweepState.resumes`.

A checkpoint is loaded by the workers, and loading one unpickles (DeepSpeed's, DCP's metadata), so a trial
resumes only from a checkpoint inside its study's checkpoint folder of this sweep, in folders owned by this user
that no other user can change (:mod:`optuna_saturn.training.checkpoint_paths`): whoever can write a trial attribute
cannot make the workers load a file of their choosing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import optuna

from optuna_saturn.pricing.prices import TrialPrice
from optuna_saturn.strategy import Strategy
from optuna_saturn.study import records
from optuna_saturn.sweep.state import SweepState, TrialRun
from optuna_saturn.training import checkpoint
from optuna_saturn.training.checkpoint_paths import refusal

_logger = optuna.logging.get_logger("optuna.saturn")


class Resumes:
    def __init__(
        self,
        state: SweepState,
        strategies: dict[str, Strategy],
        *,
        root: Path,
        shared: bool,
        exists: Callable[[str], bool],
    ) -> None:
        self._state = state
        self._exists = exists  # whether the pool's jobs can load a checkpoint at a path
        self.on_disk = True  # whether checkpoints are files (a simulated pool's are on no disk)
        self._root = root  # the study's checkpoint folder in this sweep (its name is the study's folder id)
        self._strategies = strategies
        self._shared = shared  # every device reads a checkpoint another wrote (one machine, or a shared folder)

    def inherited(self, trial: optuna.Trial) -> checkpoint.CheckpointRecord | None:
        """The checkpoint a retried trial inherited from the run the dead sweep left, if it is still on disk."""
        data = records.record(trial, "checkpoint") if records.record(trial, "retry_of") is not None else None
        if not data:
            return None
        record = checkpoint.CheckpointRecord.from_json(data)
        refused = self.refused(record)
        if refused:
            _logger.warning(
                f"Trial {trial.number} runs again from the start: its checkpoint {record.path} is "
                f"not loaded ({refused})."
            )
            return None
        if not self._exists(record.path):
            _logger.warning(f"Trial {trial.number} runs again from the start: its checkpoint {record.path} is gone.")
            return None
        _logger.info(
            f"Trial {trial.number} resumes from step {record.step} ({record.strategy} x"
            f"{record.world_size} checkpoint in {record.path})."
        )
        return record

    def refused(self, record: checkpoint.CheckpointRecord) -> str:
        """Why the workers must not load ``record``; "" if they may
        (:func:`optuna_saturn.training.checkpoint_paths.refusal`: a trial's checkpoint in this study's checkpoint folder
        of this sweep, in folders only this user can change; the worker checks again before it loads)."""
        return refusal(record.path, self._root, on_disk=self.on_disk)

    def from_run(self, run: TrialRun, *, moved: bool = False) -> None:
        """The trial of ``run`` goes on from the checkpoint it saved (a moved trial always; after a failure only
        if every device can read it)."""
        if run.session.checkpoint is not None and (moved or self._shared):
            self._state.resume_from(run.number, checkpoint.CheckpointRecord.from_json(run.session.checkpoint))

    def restricted(self, number: int, price: TrialPrice, *, leaving: tuple | None = None) -> TrialPrice:
        """``price`` with only the options that can load the trial's checkpoint (all of them, and from the start,
        if none can), and without the option ``leaving`` (the one a move left) if others remain."""
        record = self._state.resumes.get(number)
        if record is not None:
            able = [
                p
                for p in price.options
                if checkpoint.can_resume(
                    record, self._strategies[p.option.strategy].engine, p.option.devices, p.option.strategy
                )
            ]
            if able:
                price.options = able
            else:
                _logger.warning(
                    f"Trial {number} runs again from the start: none of its options can load its "
                    f"{record.format} checkpoint of {record.world_size} rank(s)."
                )
                self._state.resume_from(number, None)
        others = [p for p in price.options if p.option.choice != leaving]
        if leaving is not None and others:
            price.options = others
        return price
