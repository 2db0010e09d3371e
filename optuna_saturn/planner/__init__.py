"""SPASE planner: pick one option per job, concrete devices and a start, minimising the makespan (or, given a
:class:`Goal`, the device-seconds that meet a :class:`Deadline`, or the makespan within a :class:`Budget`).

Pure: no processes, no Optuna. See DESIGN.md decision 6.
"""

from __future__ import annotations

from optuna_saturn.planner._baselines import sequential_max, task_parallel
from optuna_saturn.planner._bounds import lower_bound
from optuna_saturn.planner._duration import parse_duration
from optuna_saturn.planner._goal import (
    MAKESPAN,
    Budget,
    Deadline,
    DeadlineUnreachable,
    Goal,
    GoalModel,
    Makespan,
    device_seconds,
    goal_of,
)
from optuna_saturn.planner._nodes import fewest_nodes
from optuna_saturn.planner._options import prune_options
from optuna_saturn.planner._replan import reflow, repair, replan
from optuna_saturn.planner._resize import Resize, best_resize, remaining_job
from optuna_saturn.planner._solve import SOLVERS, solve
from optuna_saturn.planner._types import Assignment, Cluster, Job, Option, Plan, Reservation
from optuna_saturn.planner._validate import plan_problems, validate
from optuna_saturn.planner._work_limit import WorkLimit

__all__ = [
    "MAKESPAN",
    "SOLVERS",
    "Assignment",
    "Budget",
    "Cluster",
    "Deadline",
    "DeadlineUnreachable",
    "Goal",
    "GoalModel",
    "Job",
    "Makespan",
    "Option",
    "Plan",
    "Reservation",
    "Resize",
    "WorkLimit",
    "best_resize",
    "device_seconds",
    "fewest_nodes",
    "goal_of",
    "lower_bound",
    "parse_duration",
    "plan_problems",
    "prune_options",
    "reflow",
    "remaining_job",
    "repair",
    "replan",
    "sequential_max",
    "solve",
    "task_parallel",
    "validate",
]
