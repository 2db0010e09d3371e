"""What a pool of other machines' nodes (Ray's, SLURM's) allows, alike for each: its warm workers run the trials
(no launcher of a strategy's own), and a trial moves between nodes only through a checkpoint folder they all
mount. ``runner`` names the pool in what is said."""

from __future__ import annotations

import os
from collections.abc import Sequence

import optuna

from optuna_saturn.strategy import Strategy

_logger = optuna.logging.get_logger("optuna.saturn")


def warm_only(strategies: list[Strategy], asked: Sequence[str] | None, runner: str) -> list[Strategy]:
    """Those warm workers run. A strategy whose launcher must own the trial's processes (DeepSpeed's launcher,
    ``accelerate launch``) cannot run in a warm worker: named, it is an error; among all the known ones, it is left
    out."""
    launched = [s.name for s in strategies if s.launcher != "torchrun"]
    if launched and asked is not None:
        raise ValueError(
            f"{runner} runs trials in warm workers, and {launched} need their own launcher to start the trial's "
            "processes. Leave them out of strategies=, or use runner='local'."
        )
    if launched:
        _logger.info(f"{runner} leaves out {launched}: they need their own launcher.")
    return [s for s in strategies if s.launcher == "torchrun"]


def elastic_across_nodes(
    wanted: bool, *, checkpoint_dir: str | os.PathLike | None, isolate_network: bool, runner: str
) -> bool:
    """Whether trials may move (``wanted``: the user's ``elastic``): only with a ``checkpoint_dir``, which must be
    a folder every node mounts. ``isolate_network`` is refused: no launcher starts there to isolate."""
    if isolate_network:
        raise ValueError(
            f"isolate_network applies to the local runner's launches; {runner} starts no launcher "
            "(its trials' process groups talk over each node's loopback). Leave it False."
        )
    if wanted and checkpoint_dir is None:
        # a moved trial resumes on whichever node the plan picks: from a folder every node must read
        _logger.info(
            f"{runner} without a checkpoint_dir: elastic resize is off (a moved trial resumes "
            "from its checkpoint, which must be in a folder every node shares)."
        )
        return False
    return wanted
