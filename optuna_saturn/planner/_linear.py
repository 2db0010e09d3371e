"""A MILP in row form, and the two solvers that take it: Gurobi (one thread) and HiGHS. Each stops at a time limit,
or at a work limit (:mod:`optuna_saturn.planner._work_limit`), and says whether it proved its answer optimal."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from optuna_saturn.planner._work_limit import WorkLimit


class SolverUnavailable(RuntimeError):
    """A backend cannot run here (not installed, no licence, model over the licence's size limit)."""


@dataclass
class LinearModel:
    """A MILP in row form: ``min c.x`` s.t. ``row_lo <= A x <= row_hi``, bounds, integrality."""

    cost: list[float] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    rows: list[tuple[list[int], list[float], float, float]] = field(default_factory=list)

    def add_var(self, *, cost: float = 0.0, lower: float = 0.0, upper: float = math.inf, integer: bool = False) -> int:
        self.cost.append(cost)
        self.lower.append(lower)
        self.upper.append(upper)
        self.integer.append(integer)
        return len(self.cost) - 1

    def add_row(self, coefs: dict[int, float], lo: float, hi: float) -> None:
        idx = sorted(coefs)
        self.rows.append((idx, [coefs[i] for i in idx], lo, hi))

    @property
    def num_vars(self) -> int:
        return len(self.cost)


@dataclass
class MilpResult:
    values: list[float] | None
    optimal: bool
    bound: float


def solve_gurobi(
    model: LinearModel, *, time_limit: float, seed: int, start: list[float] | None, work_limit: WorkLimit | None = None
) -> MilpResult:
    """Solve with gurobipy (one thread). Raises ``SolverUnavailable`` on import, licence or size-limit errors.
    Given ``work_limit``, Gurobi stops at its work units (deterministic on one thread) instead of the wall clock."""
    try:
        import gurobipy as gp
        import numpy
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SolverUnavailable(f"gurobipy is not installed ({e})") from e
    try:
        env = gp.Env(empty=True)
        env.setParam("OutputFlag", 0)
        env.start()
        g = gp.Model(env=env)
        g.Params.Threads = 1
        g.Params.Seed = seed
        if work_limit is None:
            g.Params.TimeLimit = max(time_limit, 0.01)
        else:
            g.Params.WorkLimit = max(work_limit.gurobi_work, 1e-4)
        g.Params.MIPGap = 1e-6
        vtypes = [gp.GRB.INTEGER if i else gp.GRB.CONTINUOUS for i in model.integer]
        upper = [u if math.isfinite(u) else gp.GRB.INFINITY for u in model.upper]
        x = g.addMVar(
            model.num_vars,
            lb=numpy.array(model.lower),
            ub=numpy.array(upper),
            obj=numpy.array(model.cost),
            vtype=numpy.array(vtypes),
        )
        xs = x.tolist()
        for idx, coefs, lo, hi in model.rows:
            expr = gp.LinExpr(coefs, [xs[i] for i in idx])
            if lo == hi:
                g.addLConstr(expr, gp.GRB.EQUAL, lo)
            else:
                if math.isfinite(lo):
                    g.addLConstr(expr, gp.GRB.GREATER_EQUAL, lo)
                if math.isfinite(hi):
                    g.addLConstr(expr, gp.GRB.LESS_EQUAL, hi)
        if start is not None:
            for i, v in enumerate(start):
                xs[i].Start = v
        g.optimize()
        if g.SolCount == 0:
            return MilpResult(None, False, g.ObjBound if g.Status == gp.GRB.OPTIMAL else -math.inf)
        return MilpResult([v.X for v in xs], g.Status == gp.GRB.OPTIMAL, g.ObjBound)
    except gp.GurobiError as e:
        if getattr(e, "errno", None) == 10010:
            raise SolverUnavailable(
                f"Gurobi's size-limited licence refused the model ({model.num_vars} variables, {len(model.rows)} "
                f"constraints; GurobiError 10010: {e})"
            ) from e
        raise SolverUnavailable(f"Gurobi failed: {e} (errno {getattr(e, 'errno', None)})") from e


def solve_highs(
    model: LinearModel, *, time_limit: float, seed: int, start: list[float] | None, work_limit: WorkLimit | None = None
) -> MilpResult:
    """Solve with HiGHS (one thread, fixed random seed). Given ``work_limit``, HiGHS stops at a node limit instead of
    the wall clock, and is not run at all where the budget does not cover its root node (no solution, as when a
    time limit runs out first)."""
    try:
        import highspy
    except ImportError as e:  # pragma: no cover
        raise SolverUnavailable(f"highspy is not installed ({e})") from e
    nodes = None if work_limit is None else work_limit.highs_nodes(sum(len(idx) for idx, _, _, _ in model.rows))
    if nodes == 0:
        return MilpResult(None, False, -math.inf)
    # The core class: the Python wrapper prints a banner on construction even before options can silence it.
    h = highspy._core._Highs() if hasattr(highspy, "_core") else highspy.Highs()
    for k, v in {
        "output_flag": False,
        "random_seed": seed,
        "mip_rel_gap": 1e-6,
        "threads": 1,
        **({"time_limit": max(time_limit, 0.01)} if nodes is None else {"mip_max_nodes": nodes}),
    }.items():
        h.setOptionValue(k, v)
    inf = highspy.kHighsInf
    lp = highspy.HighsLp()
    lp.num_col_ = model.num_vars
    lp.num_row_ = len(model.rows)
    lp.col_cost_ = model.cost
    lp.col_lower_ = model.lower
    lp.col_upper_ = [u if math.isfinite(u) else inf for u in model.upper]
    lp.row_lower_ = [lo if math.isfinite(lo) else -inf for _, _, lo, _ in model.rows]
    lp.row_upper_ = [hi if math.isfinite(hi) else inf for _, _, _, hi in model.rows]
    starts, index, value = [0], [], []
    for idx, coefs, _, _ in model.rows:
        index += idx
        value += coefs
        starts.append(len(index))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = model.num_vars
    lp.a_matrix_.num_row_ = len(model.rows)
    lp.a_matrix_.start_ = starts
    lp.a_matrix_.index_ = index
    lp.a_matrix_.value_ = value
    kinds = highspy.HighsVarType
    lp.integrality_ = [kinds.kInteger if i else kinds.kContinuous for i in model.integer]
    h.passModel(lp)
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = start
        sol.value_valid = True
        h.setSolution(sol)
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    sol = h.getSolution()
    has = info.primal_solution_status >= 1 and len(sol.col_value) == model.num_vars
    bound = info.mip_dual_bound if math.isfinite(info.mip_dual_bound) else -math.inf
    return MilpResult(list(sol.col_value) if has else None, status == highspy.HighsModelStatus.kOptimal, bound)


BACKENDS = {"gurobi": solve_gurobi, "highs": solve_highs}
