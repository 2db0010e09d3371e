"""Elastic resize in the sweep: what moving a running trial costs, and which running trials may move.

The decision itself is the planner's (:func:`~optuna_saturn.planner.best_resize`, pure); this module turns a
running trial into what that rule needs. A trial may move only once it has saved a checkpoint in this run (the
proof that its objective checkpoints, and what it resumes from), to options that can load that checkpoint, at
most ``MAX_MOVES`` times. It is stopped right after its next checkpoint (``trial.checkpoint`` answers "stop"), so
no step is lost; the cost of the move is what the trial waits and pays meanwhile, measured on its own run:

- half the interval between its checkpoints (the next one comes, on average, that much later, while the
  devices it moves to may wait);
- saving that checkpoint and loading it back (its last save, twice);
- its run's start-up (from its launch to its first step: a new process group, the objective's set-up).

Only trials whose checkpoints are ``torch.distributed.checkpoint``s move (single, DDP, FSDP): DeepSpeed's does
not reshard, and one ZeRO stage's does not load into another.

``simulator.simulate(resize_seconds=...)`` and ``benchmarks/elastic_resize.py`` measure the rule under noise and
prunes; ``benchmarks/README.md`` has the figures.
"""

from __future__ import annotations

from collections.abc import Sequence

from optuna_saturn import checkpoint
from optuna_saturn._session import TrialSession
from optuna_saturn.planner import Job, Option, remaining_job

#: A trial moves at most this often in one sweep (a plan's estimates are noisy: no ping-pong on them).
MAX_MOVES = 2


def move_cost_seconds(session: TrialSession, startup_seconds: float) -> float:
    """Seconds a move costs this run (see the module's docstring)."""
    steps = session.checkpoint_steps
    if len(steps) >= 2:
        interval_steps = steps[-1] - steps[-2]
    else:
        interval_steps = steps[-1] - session.resumed_from if steps else 0
    wait = 0.5 * max(interval_steps, 0) * (session.step_seconds or 0.0)
    return wait + 2 * session.checkpoint_seconds + max(startup_seconds, 0.0)


def rest_of_run(
    name: str,
    session: TrialSession,
    options: Sequence[Option],
    current: Option,
    remaining_seconds: float,
    *,
    engines: dict[str, str],
    cost: float,
) -> Job | None:
    """The rest of a running trial as a job to plan under its other options (those that can load its latest
    checkpoint), or None if it may not move. ``options`` are its options as planned (``current`` among them),
    ``remaining_seconds`` what its own option still needs at its measured step rate: another option is expected
    to need that times its runtime over the current one's, plus ``cost``."""
    if session.checkpoint is None or session.move_requested or not current.runtime > 0:
        return None
    record = checkpoint.CheckpointRecord.from_json(session.checkpoint)
    if record.format != checkpoint.DCP:  # DeepSpeed's reshards only into its own ZeRO stage, by a conversion: kept
        return None
    able = [o for o in options if checkpoint.can_resume(record, engines[o.strategy], o.devices)]
    return remaining_job(name, able, current=current.choice, left=1.0, rate=remaining_seconds / current.runtime,
                         restart=cost)
