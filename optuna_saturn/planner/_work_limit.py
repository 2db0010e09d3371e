"""A planning work limit counted in work done, not in seconds: the same inputs and seed then give the same plan on any
machine, however busy it is.

Why: every backend used to stop at a wall-clock limit (CP-SAT's ``max_time_in_seconds``, HiGHS's and Gurobi's time
limits, the heuristics' ``perf_counter`` loops). A plan then depends on how fast the machine happened to be while it
was made, and so does everything decided from it: the simulator, which runs the real loop in virtual time, moved a
seed's makespan by up to 3% (once 12%) between two runs of the same code. A real sweep keeps its wall-clock cap
(``time_limit``): a plan that waits for a slow machine costs real devices' time. The simulator, whose clock is
virtual, plans with a :class:`WorkLimit` instead.

Each backend counts work in its own deterministic unit, and a unit of :class:`WorkLimit` is converted to each of them
below: about what each backend does in a second of a long solve on the development machine (2 cores). Gurobi's work
units and CP-SAT's deterministic seconds are both meant to be "about a second" already. A short solve spends most of
its wall time loading its model, which none of these counts, so a work limit of a tenth of a unit takes longer than a
tenth of a second: the sweep's re-plans have their own work limit (``optuna_saturn.sweep.planning.REPLAN_WORK``). The
conversions need not be exact, only fixed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Moldable list scheduling: options weighed for a place, per unit (230 000-450 000 a second).
LIST_PLACEMENTS_PER_UNIT = 300_000
#: The iterated list search: options weighed for a place, per unit (each of its plans draws a fresh allotment or
#: order first: 60 000 a second).
SEARCH_PLACEMENTS_PER_UNIT = 60_000
#: CP-SAT's deterministic seconds per unit (0.55-0.6 a second over 1-10 s on the paper-like model).
CPSAT_SECONDS_PER_UNIT = 0.5
#: Gurobi's work units per unit (0.8-0.9 a second over 1-10 s on the paper-like block model).
GUROBI_WORK_PER_UNIT = 1.0
#: HiGHS's branch-and-bound nodes per unit (the paper-like block model: 9 600 nodes in 10 s).
HIGHS_NODES_PER_UNIT = 1_000
#: HiGHS's root node (presolve, the LP, cuts, heuristics) is one node whatever it costs: the MILP runs only where
#: the limit covers the root's cost, estimated from the model's non-zeros (the paper-like model's 718 took 0.6 s).
#: Below that the plan stays the other stages' one, as when a time limit runs out during the root.
HIGHS_ROOT_NONZEROS_PER_UNIT = 1_200


@dataclass(frozen=True)
class WorkLimit:
    """How much search a plan may take, in work ``units``: about what a second of a long solve does on the machine
    the conversions were measured on, but counted, so that it does the same on every machine.

    Pass it as ``work_limit`` to :func:`~optuna_saturn.planner.solve`, :func:`~optuna_saturn.planner.replan` or
    :func:`~optuna_saturn.planner.best_resize` in place of ``time_limit``: the solvers then stop at work limits
    (CP-SAT's deterministic time on one worker, Gurobi's ``WorkLimit``, HiGHS's node limit, the heuristics' count of
    placements tried), never at the wall clock, and the plan depends only on the inputs and ``seed``.
    """

    units: float

    def __post_init__(self) -> None:
        if not (isinstance(self.units, (int, float)) and math.isfinite(self.units) and self.units >= 0):
            raise ValueError(f"WorkLimit.units must be a finite number >= 0, got {self.units!r}.")

    def share(self, fraction: float) -> WorkLimit:
        """This much of the work limit (``solve`` splits one between its stages as it splits a time limit)."""
        return WorkLimit(self.units * fraction)

    @property
    def list_placements(self) -> int:
        """Options moldable list scheduling may weigh for a place."""
        return int(self.units * LIST_PLACEMENTS_PER_UNIT)

    @property
    def search_placements(self) -> int:
        """Options the iterated list search may weigh for a place."""
        return int(self.units * SEARCH_PLACEMENTS_PER_UNIT)

    @property
    def cpsat_seconds(self) -> float:
        """CP-SAT's ``max_deterministic_time``."""
        return self.units * CPSAT_SECONDS_PER_UNIT

    @property
    def gurobi_work(self) -> float:
        """Gurobi's ``WorkLimit``."""
        return self.units * GUROBI_WORK_PER_UNIT

    def highs_nodes(self, nonzeros: int) -> int:
        """HiGHS's ``mip_max_nodes`` on a model of ``nonzeros`` non-zeros; 0 (do not run it) when the limit does not
        cover its root node."""
        if self.units < nonzeros / HIGHS_ROOT_NONZEROS_PER_UNIT:
            return 0
        return max(1, int(self.units * HIGHS_NODES_PER_UNIT))
