"""SPASE planner: pick one option per job, concrete devices and a start, minimising the makespan (or, given an
:class:`Objective`, the device-seconds that meet a deadline, or the makespan within a budget).

Pure: no processes, no Optuna. See DESIGN.md decision 6.
"""

from __future__ import annotations

from optuna_saturn.planner._baselines import sequential_max, task_parallel
from optuna_saturn.planner._bounds import lower_bound
from optuna_saturn.planner._budget import WorkLimit
from optuna_saturn.planner._nodes import fewest_nodes
from optuna_saturn.planner._objective import (
    MAKESPAN,
    DeadlineUnreachable,
    Objective,
    device_seconds,
    objective_of,
    parse_duration,
)
from optuna_saturn.planner._options import prune_options
from optuna_saturn.planner._replan import reflow, repair, replan
from optuna_saturn.planner._resize import Resize, best_resize, remaining_job
from optuna_saturn.planner._solve import SOLVERS, solve
from optuna_saturn.planner._types import Assignment, Cluster, Job, Option, Plan, Reservation
from optuna_saturn.planner._validate import plan_problems, validate

__all__ = [
    "MAKESPAN",
    "SOLVERS",
    "Assignment",
    "Cluster",
    "DeadlineUnreachable",
    "Job",
    "Objective",
    "Option",
    "Plan",
    "Reservation",
    "Resize",
    "WorkLimit",
    "best_resize",
    "device_seconds",
    "fewest_nodes",
    "lower_bound",
    "objective_of",
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
