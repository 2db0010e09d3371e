"""A plain ``accelerate.Accelerator`` inside a trial must not pretend to run the trial's strategy.

Accelerate's ``Accelerator()`` wraps the model in DDP whenever there are several processes (and turns FSDP and
DeepSpeed plugins into DDP on CPU), with each process loading its own batch: under any strategy but ``single`` it
would train something else than the strategy the sweep records, on a global batch that grows with the device
count. So while a trial runs, its ``prepare`` refuses with a ``StrategyMismatch`` naming ``trial.accelerator()``
(the planner then leaves that strategy out for the trial); on one device under ``single`` it is the user's own
one-process code and runs as it is. A ``Trainer`` made before ``trial.prepare_trainer`` never calls it: that
replaces its accelerator first.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from optuna_saturn.engines import StrategyMismatch

if TYPE_CHECKING:
    from optuna_saturn.training.training_trial import TrainingTrial

_running: TrainingTrial | None = None


def install() -> None:
    """Wrap ``Accelerator.prepare`` (idempotent; once per worker process)."""
    from accelerate import Accelerator

    if getattr(Accelerator.prepare, "_saturn_guard", False):
        return
    original = Accelerator.prepare

    @functools.wraps(original)
    def prepare(self: Any, *args: Any, **kwargs: Any) -> Any:
        trial = _running
        if trial is not None and (trial.world_size > 1 or not trial.strategy.engine_traits.runs_one_process):
            raise StrategyMismatch(
                f"This trial runs under '{trial.strategy.name}' on {trial.world_size} device(s), but the objective "
                "prepares with Accelerate's own Accelerator(), which would run DDP (or one plain process) instead, "
                "with a batch per process. Write `accelerator = trial.accelerator()` instead of "
                "`Accelerator()`, or call `trial.prepare_trainer(trainer)` on a transformers.Trainer; until then the "
                "planner runs this trial on 'single' only."
            )
        return original(self, *args, **kwargs)

    prepare._saturn_guard = True  # type: ignore[attr-defined]  # a marker on the function: installed once
    Accelerator.prepare = prepare


@contextlib.contextmanager
def running(trial: TrainingTrial) -> Iterator[None]:
    """While ``trial``'s objective runs in this process."""
    global _running
    install()
    _running = trial
    try:
        yield
    finally:
        _running = None
