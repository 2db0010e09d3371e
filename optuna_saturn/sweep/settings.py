"""What a sweep is told once, at its start: the executor's options, as the loop and its policies read them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optuna_saturn.devices import Device
from optuna_saturn.events import SweepListener
from optuna_saturn.planner import MAKESPAN, Goal, Plan, WorkLimit
from optuna_saturn.strategy import Strategy


@dataclass(frozen=True)
class SweepSettings:
    devices: Sequence[Device]
    strategies: Sequence[Strategy]
    solver: str
    time_limit: float
    log_dir: Path
    artifact_store: Any = None
    listeners: Sequence[SweepListener] = ()
    profile_steps: tuple[int, int] = (2, 5)  # warm-up steps, timed steps
    profile_budget: float | None = None  # device-seconds of profiling jobs per sweep (None: as they pay)
    profile_only: bool = False  # measure every option, run no trial
    describe_asked: bool = True  # False: asked trials are not described (one option: nothing to choose)
    max_retries: int = 1  # runs again of a trial whose sweep died while it ran
    checkpoint_dir: Path | None = None  # where trials' checkpoints go (None: <log_dir>/checkpoints)
    keep_checkpoints: bool = False  # keep them after a trial ends COMPLETE or PRUNED
    stall_timeout: float | None = None  # seconds without progress after which a trial is stopped (None: derived)
    plan_for_pruning: bool = False  # price trials at what they are expected to run under the study's pruner
    plan_to_next_rung: bool = False  # that too, and a trial likely pruned at its next rung gets its efficient options
    elastic: bool = True  # move a running trial that checkpoints to another option when the sweep ends sooner
    # -- how the planner is used (the simulator varies them; a real sweep keeps the defaults) ---------------------
    replan: bool = True  # False: a trial keeps the place its first plan gave it ("static")
    min_improvement: float = 0.02  # a fresh plan replaces the one being executed when this much shorter
    seed: int = 0
    # None: plans stop at wall-clock limits (a real sweep: a plan that waits for a slow machine costs devices' time);
    # a WorkLimit: at that much work, so that the same seed gives the same sweep on any machine (the simulator, whose
    # clock is virtual). The planning policy's per-plan caps apply to both.
    plan_work: WorkLimit | None = None
    # what the plans are best at: the earliest end (makespan), every known trial by a deadline (seconds from the
    # sweep's start) at the fewest device-seconds, or the earliest end within a budget of device-seconds
    goal: Goal = MAKESPAN  # the planner's (the user's objective function is not a setting)
    first_plan: Plan | None = None  # the plan of the first trials, instead of solving it (a replay)
    max_moves: int = 2  # elastic moves per trial
    # -- what a storage shared with other sweeps needs (off in a simulation's in-memory study) -------------------
    owned: bool = True  # a heartbeat, owner records, recovery of dead sweeps' trials, the outbox
