"""A compact MILP for SPASE on aligned device blocks, built once and emitted to Gurobi or HiGHS.

Why this formulation. Devices in a node are interchangeable, so one variable per job per GPU (as in the original
Saturn) wastes the licence budget and the solver's time on symmetry. Instead each node is cut into a laminar
family of aligned blocks (buddy blocks of 1, 2, 4, ... devices, plus the whole node when its size is not a power of
two), and a job picks one (option, block) with the smallest block size that holds the option. For a laminar
family a schedule is easy to build: run each block's jobs back to back once every block below it is done
(bottom-up stacking). So with ``L_B`` the summed runtime of the jobs on block ``B``:

    min  Cmax
    s.t. sum_{o, B} x[j, o, B] = 1                       for every job j
         C[leaf d] >= busy_until(d) + L_leaf              for every device d
         C[B] >= C[child] + L_B                           for every block B and child block
         Cmax >= C[root of node]                          for every node
         Cmax >= lower_bound                              (a valid cut; lets the solver stop at a proven optimum)
         C[left] >= C[right]                              for sibling subtrees that are identical (symmetry)

Size: (jobs x options x blocks of the right size) binaries plus one continuous variable per block, and about
jobs + 2 x devices rows: 24 jobs with 6 options on one 8-device node is a few hundred variables, well inside the
pip Gurobi licence. The block restriction can cost optimality (a 2-device job may not sit on devices 1-2), so a
proven block optimum is reported as optimal only when it meets the global lower bound; ``solve`` may still
improve it with CP-SAT.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from optuna_saturn.planner._devices import compact
from optuna_saturn.planner._goal import MAKESPAN, Goal
from optuna_saturn.planner._linear import BACKENDS, LinearModel
from optuna_saturn.planner._types import Assignment, Cluster, Job, Option, Plan, Reservation
from optuna_saturn.planner._work_limit import WorkLimit


@dataclass(frozen=True)
class Block:
    node: int
    offset: int
    size: int
    children: tuple[int, ...]  # indices into the block list


def node_blocks(cluster: Cluster) -> list[Block]:
    """The laminar block family of every node (buddy blocks, plus the whole node if not a power of two).

    Blocks are listed children first, so a single pass in list order visits every child before its parent.
    """
    blocks: list[Block] = []
    for node, n in enumerate(cluster.nodes):
        spans = []
        size = 1
        while size <= n:
            spans += [(off, size) for off in range(0, n - size + 1, size)]
            size *= 2
        if (n & (n - 1)) != 0:
            spans.append((0, n))
        spans.sort(key=lambda s: (s[1], s[0]))
        first = len(blocks)

        def inside(a: tuple[int, int], b: tuple[int, int]) -> bool:
            return b[0] <= a[0] and a[0] + a[1] <= b[0] + b[1] and a[1] < b[1]

        for k, span in enumerate(spans):
            below = [c for c in spans[:k] if inside(c, span)]
            children = tuple(first + spans.index(c) for c in below if not any(inside(c, p) for p in below))
            blocks.append(Block(node, span[0], span[1], children))
    return blocks


@dataclass
class BlockModel:
    model: LinearModel
    choices: list[tuple[int, int, Option, int]]  # (var, job index, option, block index)
    blocks: list[Block]
    cmax: int
    comp: list[int]  # C[B] per block
    busy_until: dict[tuple[int, int], float]
    feasible: bool = True  # False: the goal's bound is below what any plan reaches (no need to run the solver)


class _BlockTerms:
    """The block model as a goal shapes it (:class:`~optuna_saturn.planner.GoalModel`): its end is ``Cmax``, its
    device-seconds the chosen options' ``devices x runtime``."""

    def __init__(self, bm: BlockModel) -> None:
        self._bm = bm
        self._spent = {v: option.devices * option.runtime for v, _, option, _ in bm.choices}

    def limit_end(self, seconds: float) -> None:
        """Every planned job's end, not a running one's (the goal counts the plan's jobs, as CP-SAT does): a block
        whose devices are all free by ``seconds`` completes by then; no job goes on a block with a device busy
        past it (its jobs would start later), and that block's completion, like ``Cmax``, may pass it."""
        bm, model = self._bm, self._bm.model
        late = {where for where, until in bm.busy_until.items() if until > seconds}
        for bi, b in enumerate(bm.blocks):
            if any((b.node, d) in late for d in range(b.offset, b.offset + b.size)):
                for v in (v for v, _, _, on in bm.choices if on == bi):
                    model.upper[v] = 0.0
            else:
                model.upper[bm.comp[bi]] = min(model.upper[bm.comp[bi]], seconds)
        last = max([seconds, *bm.busy_until.values()])
        model.upper[bm.cmax] = min(model.upper[bm.cmax], last)
        bm.feasible &= model.lower[bm.cmax] <= min(seconds, model.upper[bm.cmax])

    def limit_spent(self, device_seconds: float) -> None:
        self._bm.model.add_row(self._spent, -math.inf, device_seconds)

    def minimise_end(self) -> None:
        self._bm.model.cost[self._bm.cmax] = 1.0

    def minimise_spent(self) -> None:
        for v, cost in self._spent.items():
            self._bm.model.cost[v] = cost


def build_block_model(
    jobs: Sequence[Job],
    cluster: Cluster,
    *,
    busy: Sequence[Reservation] = (),
    lower_bound: float = 0.0,
    goal: Goal = MAKESPAN,
) -> BlockModel:
    """The aligned-block MILP described in the module docstring; ``goal`` sets what it bounds and minimises (the
    makespan's: min Cmax)."""
    blocks = node_blocks(cluster)
    m = LinearModel()
    busy_until: dict[tuple[int, int], float] = {}
    for r in busy:
        for d in r.devices:
            busy_until[(r.node, d)] = max(busy_until.get((r.node, d), 0.0), float(r.until))
    horizon = sum(max(o.runtime for o in j.options) for j in jobs) + max(busy_until.values(), default=0.0)
    cmax = m.add_var(lower=lower_bound, upper=max(horizon, lower_bound))
    comp = [m.add_var(upper=max(horizon, lower_bound)) for _ in blocks]
    sizes_by_node: dict[int, list[int]] = {}
    for b in blocks:
        sizes_by_node.setdefault(b.node, []).append(b.size)
    choices: list[tuple[int, int, Option, int]] = []
    load: dict[int, dict[int, float]] = {i: {} for i in range(len(blocks))}
    for j, job in enumerate(jobs):
        row: dict[int, float] = {}
        for option in job.options:
            for node, sizes in sizes_by_node.items():
                fit = [s for s in sizes if s >= option.devices]
                if not fit:
                    continue
                size = min(fit)
                for bi, b in enumerate(blocks):
                    if b.node == node and b.size == size:
                        v = m.add_var(upper=1.0, integer=True)
                        choices.append((v, j, option, bi))
                        row[v] = 1.0
                        load[bi][v] = option.runtime
        if not row:
            raise ValueError(f"Job {job.name!r} has no option that fits any node.")
        m.add_row(row, 1.0, 1.0)
    for bi, b in enumerate(blocks):
        if not b.children:
            coefs = {comp[bi]: 1.0}
            for v, runtime in load[bi].items():
                coefs[v] = -runtime
            m.add_row(coefs, busy_until.get((b.node, b.offset), 0.0), math.inf)
        for c in b.children:
            coefs = {comp[bi]: 1.0, comp[c]: -1.0}
            for v, runtime in load[bi].items():
                coefs[v] = -runtime
            m.add_row(coefs, 0.0, math.inf)
    for node in range(len(cluster.nodes)):
        root = max((bi for bi, b in enumerate(blocks) if b.node == node), key=lambda bi: blocks[bi].size)
        m.add_row({cmax: 1.0, comp[root]: -1.0}, 0.0, math.inf)
    # Symmetry: identical sibling subtrees (same size, no reservation inside) are interchangeable.
    for b in blocks:
        kids = [
            c
            for c in b.children
            if not any(
                (blocks[c].node, d) in busy_until for d in range(blocks[c].offset, blocks[c].offset + blocks[c].size)
            )
        ]
        for c1, c2 in itertools.pairwise(kids):
            if blocks[c1].size == blocks[c2].size:
                m.add_row({comp[c1]: 1.0, comp[c2]: -1.0}, 0.0, math.inf)
    out = BlockModel(m, choices, blocks, cmax, comp, busy_until)
    goal.shape(_BlockTerms(out))
    return out


def warm_start(bm: BlockModel, jobs: Sequence[Job], plan: Plan, busy: Sequence[Reservation]) -> list[float]:
    """A complete MIP start that keeps ``plan``'s option and node per job, on aligned blocks.

    Jobs are placed in ``plan``'s start order, each on the block of its size (on its node) that is free first;
    then identical sibling subtrees are swapped so the start also satisfies the symmetry rows.
    """
    index = {job.name: j for j, job in enumerate(jobs)}
    busy_until = _busy_until(busy)
    free = dict(busy_until)
    where: dict[int, tuple[Option, int]] = {}
    for a in sorted(plan.assignments, key=lambda a: (a.start, a.job)):
        j = index[a.job]
        cands = [bi for v, jj, o, bi in bm.choices if jj == j and o == a.option and bm.blocks[bi].node == a.node]
        if not cands:
            cands = [bi for v, jj, o, bi in bm.choices if jj == j]
            option = next(o for v, jj, o, bi in bm.choices if jj == j and bi == cands[0])
        else:
            option = a.option

        def ready(bi: int) -> float:
            b = bm.blocks[bi]
            return max(free.get((b.node, d), 0.0) for d in range(b.offset, b.offset + b.size))

        bi = min(cands, key=lambda bi: (ready(bi), bi))
        b = bm.blocks[bi]
        end = ready(bi) + option.runtime
        for d in range(b.offset, b.offset + b.size):
            free[(b.node, d)] = end
        where[j] = (option, bi)
    _canonicalise(bm, where, busy_until)
    values = [0.0] * bm.model.num_vars
    lookup = {(j, o, bi): v for v, j, o, bi in bm.choices}
    for j, (option, bi) in where.items():
        values[lookup[(j, option, bi)]] = 1.0
    comp = _completions(bm, where, busy_until)
    for bi, c in enumerate(comp):
        values[bm.cmax + 1 + bi] = c
    values[bm.cmax] = max([c for c in comp] + [bm.model.lower[bm.cmax]])
    return values


def _busy_until(busy: Sequence[Reservation]) -> dict[tuple[int, int], float]:
    out: dict[tuple[int, int], float] = {}
    for r in busy:
        for d in r.devices:
            out[(r.node, d)] = max(out.get((r.node, d), 0.0), float(r.until))
    return out


def _completions(bm: BlockModel, where: dict[int, tuple[Option, int]], busy_until: dict) -> list[float]:
    """C[B] exactly as the model rows define it (tight), for a given (option, block) per job."""
    load = [0.0] * len(bm.blocks)
    for option, bi in where.values():
        load[bi] += option.runtime
    comp = [0.0] * len(bm.blocks)
    for bi, b in enumerate(bm.blocks):
        base = max((comp[c] for c in b.children), default=busy_until.get((b.node, b.offset), 0.0))
        comp[bi] = base + load[bi]
    return comp


def _canonicalise(bm: BlockModel, where: dict[int, tuple[Option, int]], busy_until: dict) -> None:
    """Swap identical sibling subtrees, largest blocks first, so completions are non-increasing left to right."""
    by_span = {(b.node, b.offset, b.size): bi for bi, b in enumerate(bm.blocks)}
    for parent in sorted(range(len(bm.blocks)), key=lambda bi: -bm.blocks[bi].size):
        kids = [c for c in bm.blocks[parent].children if not _has_busy(bm.blocks[c], busy_until)]
        for size in sorted({bm.blocks[c].size for c in kids}):
            group = [c for c in kids if bm.blocks[c].size == size]
            if len(group) < 2:
                continue
            comp = _completions(bm, where, busy_until)
            order = sorted(group, key=lambda c: (-comp[c], c))  # target: group[i] receives order[i]'s content
            moves = {bm.blocks[src].offset: bm.blocks[dst].offset for src, dst in zip(order, group)}
            for j, (option, bi) in list(where.items()):
                b = bm.blocks[bi]
                for src_off, dst_off in moves.items():
                    if b.node == bm.blocks[parent].node and src_off <= b.offset < src_off + size and b.size <= size:
                        where[j] = (option, by_span[(b.node, b.offset - src_off + dst_off, b.size)])
                        break


def _has_busy(b: Block, busy_until: dict) -> bool:
    return any((b.node, d) in busy_until for d in range(b.offset, b.offset + b.size))


def decode(
    bm: BlockModel, jobs: Sequence[Job], values: Sequence[float], cluster: Cluster, busy: Sequence[Reservation]
) -> list[Assignment]:
    """Bottom-up stacked schedule of the chosen (option, block) pairs, then compacted."""
    on_block: dict[int, list[tuple[int, Option]]] = {}
    for v, j, option, bi in bm.choices:
        if values[v] > 0.5:
            on_block.setdefault(bi, []).append((j, option))
    free: dict[tuple[int, int], float] = {}
    for r in busy:
        for d in r.devices:
            free[(r.node, d)] = max(free.get((r.node, d), 0.0), float(r.until))
    out = []
    for bi, b in enumerate(bm.blocks):  # children come before parents
        devices = list(range(b.offset, b.offset + b.size))
        t = max(free.get((b.node, d), 0.0) for d in devices)
        for j, option in sorted(on_block.get(bi, []), key=lambda x: (-x[1].runtime, jobs[x[0]].name)):
            out.append(
                Assignment(jobs[j].name, option, b.node, tuple(devices[: option.devices]), t, t + option.runtime)
            )
            t += option.runtime
        for d in devices:
            free[(b.node, d)] = t
    return compact(out, cluster, busy=busy)


def solve_block_milp(
    jobs: Sequence[Job],
    cluster: Cluster,
    *,
    backend: str,
    busy: Sequence[Reservation] = (),
    time_limit: float,
    seed: int,
    hint: Plan | None,
    lower_bound: float,
    work_limit: WorkLimit | None = None,
    goal: Goal = MAKESPAN,
) -> Plan | None:
    """Build the block model for ``goal``, solve it with ``backend`` and decode; None if no solution was found in
    time (or, given ``work_limit``, within that work: see :func:`solve_gurobi` and :func:`solve_highs`), or none
    meets the goal's constraint."""
    bm = build_block_model(jobs, cluster, busy=busy, lower_bound=lower_bound, goal=goal)
    if not bm.feasible:
        return None
    start = warm_start(bm, jobs, hint, busy) if hint is not None else None
    result = BACKENDS[backend](bm.model, time_limit=time_limit, seed=seed, start=start, work_limit=work_limit)
    if result.values is None:
        return None
    assignments = decode(bm, jobs, result.values, cluster, busy)
    plan = Plan(tuple(sorted(assignments, key=lambda a: (a.start, a.job))), solver=backend)
    plan.info.update(
        model_vars=bm.model.num_vars,
        model_rows=len(bm.model.rows),
        block_optimal=result.optimal,
        milp_bound=result.bound,
    )
    return plan
