"""The planning policy: when to re-plan the waiting trials, and with what (DESIGN.md decision 7).

Every event that changes what waits or what runs (a trial arrives, a job ends, a measurement comes in, a node is
lost or joins) re-plans the waiting trials around the running jobs, which hold their devices for what they still
need at their measured step rate. The plan being executed is kept unless a fresh one is clearly shorter
(:func:`~optuna_saturn.planner.replan`), so a tiny gain does not reshuffle every trial's devices.

While a device has no job, the plan is what it waits for: then only the planner's heuristics run (milliseconds),
and the solvers refine the plan once every device is busy again, unless it is within 2% of its lower bound.
When hundreds of trials wait, or tens on tens of nodes (a large cluster), a fresh plan of all of them at every
event would cost more than the events leave time for: between fresh plans the last one is followed (each trial
keeps its option and its order and takes the devices that free up first; new trials join it longest first). A
fresh one is made once a tenth of the trials are new since the last, when prices or nodes changed, or when the
followed plan ends later than the fresh one did by more than 5% of its length and the new trials' work spread
over the devices, unless it is within 5% of its lower bound. With ``replan=False`` ("static", for the
simulator's comparisons) a trial keeps the place its first plan gave it; new trials are placed around it.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from optuna_saturn.planner import Assignment, Goal, Plan, WorkLimit, fewest_nodes, replan
from optuna_saturn.pricing.prices import TrialPrice
from optuna_saturn.sweep.decisions import Planned, Refusal, Unplan
from optuna_saturn.sweep.goal_now import Misses, goal_now
from optuna_saturn.sweep.options import FUTURE, OptionsView
from optuna_saturn.sweep.plan_following import FRESH_SHARE, Fresh, followed, small
from optuna_saturn.sweep.policy import Decisions, Policy
from optuna_saturn.sweep.settings import SweepSettings
from optuna_saturn.sweep.state import SweepState
from optuna_saturn.sweep.weighing import standing_for

#: Plans happen while devices may wait for them, and take a core: keep them short.
REPLAN_SECONDS = 0.1
#: The same cap counted in work, for a sweep that plans by work (``SweepSettings.plan_work``: the simulator). Chosen so
#: that the solvers do about what they did in ``REPLAN_SECONDS``: on a re-plan's small models most of that time
#: went to loading them, which work does not count (Gurobi reached 0.01 work units, CP-SAT 0.002 deterministic
#: seconds; :mod:`optuna_saturn.planner._work_limit`).
REPLAN_WORK = WorkLimit(0.025)
#: The planner's backend while a device waits for the plan: its heuristics alone (greedy and moldable list
#: scheduling, a few milliseconds; the first CP-SAT plan of a process also imports OR-Tools, 0.4 s).
URGENT_SOLVER = "list"
#: Solvers refine a plan only when it may be this much longer than its lower bound.
REFINE_GAP = 0.02


class Planning(Policy):
    """When and how to plan. Its memory (the last fresh plan, plans made, what was said) is its own, written here."""

    def __init__(self, settings: SweepSettings) -> None:
        self._solver = settings.solver
        self._time_limit = min(settings.time_limit, REPLAN_SECONDS)
        self._work_limit = work_limit(settings.plan_work)
        self._whole_limits = settings.time_limit, settings.plan_work  # (before a sweep is refused)
        self._min_improvement = settings.min_improvement if settings.replan else float("inf")
        self._seed = settings.seed
        self._goal = settings.goal
        self._misses = Misses(settings.goal)
        self._tried_fewer: tuple | None = None  # what the last try of fewer nodes saw, if it left none out
        self._ready_seen = 0  # devices whose workers were up at the last plan
        self._first_plan = settings.first_plan
        self._profile_only = settings.profile_only
        self._refine = False  # the last plan was the heuristics' alone: the solvers refine it when they may
        self.version = 0  # plans made
        self.first_makespan: float | None = None
        self._fresh: Fresh | None = None  # the last fresh plan

    def on_nodes_lost(self, state: SweepState) -> Decisions:
        return [self.unplan_lost(state)]

    @staticmethod
    def unplan_lost(state: SweepState) -> Unplan:
        """Devices were lost with their node: the trials planned on them lose their places until the next plan."""
        return Unplan(
            tuple(n for n, w in state.waiting.items() if w.assignment and set(w.assignment.devices) & state.lost)
        )

    def workers_came_up(self, state: SweepState) -> bool:
        """Under a deadline or a budget, workers that came up are planned on at once (the last plan counted on them)."""
        if not self._goal.whole_sweep or len(state.ready_at) == self._ready_seen:
            return False
        self._ready_seen = len(state.ready_at)
        return True

    def due(self, state: SweepState, ready: set[int]) -> bool:
        """Whether to plan now: something changed, or the heuristics' plan is to be refined and no device waits.
        When many trials wait, a change that leaves every device busy (a trial ended, the next one started on its
        devices as planned) waits for the next one that does not, or for a fresh plan to be due."""
        if not state.plan_dirty:
            return self._refine and not state.free()
        if small(len(state.waiting), state) or self._fresh is None or state.free() & ready:
            return True
        fresh_names, changes, _, _ = self._fresh  # (a trial that arrived meanwhile is placed by the next plan)
        new = sum(1 for n in state.waiting if str(n) not in fresh_names)
        return changes != state.changes or new >= FRESH_SHARE * len(state.waiting)

    def plan(self, state: SweepState, view: OptionsView, now: float) -> Planned | None:
        """The waiting trials' places (the previous ones kept unless a new plan is clearly shorter)."""
        self._refine = False
        if not state.waiting or self._profile_only:
            return None
        self.version += 1
        jobs, busy = view.jobs_and_busy(state, now)
        previous = self._previous_plan(state)
        min_improvement = self._min_improvement
        if previous is None and self._first_plan is not None:  # a replay: the first plan is given
            previous, self._first_plan, min_improvement = self._first_plan, None, float("inf")
        goal = goal_now(self._goal, state, busy, now)
        plan = followed(previous, self._fresh, jobs, busy, state, now) if goal.earliest_end else None
        if plan is None:
            urgent = self._solver == "auto" and bool(state.free())
            plan = self._solved(previous, jobs, busy, state, goal, min_improvement, first=self.version == 1)
            solver = URGENT_SOLVER if urgent else self._solver
            # (nodes idle to the end go back; a try that left none out is made again once the trials, or the nodes
            # free of jobs, changed)
            tried = (frozenset(j.name for j in jobs), frozenset(r.node for r in busy), state.cluster)
            if goal.packs_nodes and plan.info.get("met") and state.all_asked and tried != self._tried_fewer:
                fewer = partial(replan, None, jobs, seed=self._seed, goal=goal, solver=solver,
                                time_limit=self._time_limit, work_limit=self._work_limit)  # fmt: skip
                on_fewer = fewest_nodes(plan, state.cluster, busy, lambda c, b: fewer(cluster=c, busy=b))
                plan, self._tried_fewer = on_fewer, (tried if on_fewer is plan else None)
            self._refine = urgent and plan.makespan > plan.lower_bound * (1 + REFINE_GAP)
            self._fresh = (
                {j.name for j in jobs if not j.name.startswith(FUTURE)},
                state.changes,
                now + plan.makespan,
                plan.makespan,
            )
        places: dict[int, Assignment] = {}
        for a in plan.assignments:
            if a.job.startswith(FUTURE):
                continue
            waiting = state.waiting[int(a.job)]
            option = next(o for o in view.options(waiting, state) if o.choice == a.option.choice)  # its own runtime
            places[waiting.number] = state.topology.to_global(replace(a, option=option, end=a.start + option.runtime))
        shown = Plan(
            tuple(places.values()), solver=plan.solver, lower_bound=plan.lower_bound, solve_seconds=plan.solve_seconds
        )
        if self.first_makespan is None:
            self.first_makespan = now + shown.makespan
        to_come = [a.end for a in plan.assignments if a.job.startswith(FUTURE)]  # (a deadline is the whole sweep's)
        end = now + max([shown.makespan, *to_come, *(r.until for r in busy)])
        return Planned(places, shown, now, self._misses.refusal(plan, end, goal, first=self.version == 1), end)

    def deadline_check(self, price: TrialPrice | None, state: SweepState, view: OptionsView, now: float) -> Refusal:
        """Under a deadline, before the first trial is asked: the sweep planned as trials like ``price``'s (a trial
        the study never saw), as many as its first plan counts; a deadline that plan misses is refused now, before
        the study holds a trial of this sweep."""
        jobs = view.future_jobs(state, like=standing_for(price)) if price is not None else []
        if not jobs:
            return Refusal("", 0.0)
        unsure = min(p.uncertainty for p in price.options) if price is not None else 0.0
        goal = goal_now(self._goal, state, [], now, unsure=unsure)
        plan = self._solved(None, jobs, [], state, goal, self._min_improvement, first=True)
        end = now + max((a.end for a in plan.assignments), default=0.0)
        return Refusal(self._misses.refusal(plan, end, goal, first=True), end)

    def _solved(
        self,
        previous: Plan | None,
        jobs: list,
        busy: list,
        state: SweepState,
        goal: Goal,
        improve: float,
        *,
        first: bool,
    ) -> Plan:
        """A fresh plan, by the heuristics alone while a device waits; the first one that misses a deadline the
        lower bound allows is made again with the solvers' whole time before the sweep is refused."""
        urgent = self._solver == "auto" and bool(state.free())
        solve = partial(replan, jobs=jobs, cluster=state.cluster, busy=busy, seed=self._seed, goal=goal)
        solver = URGENT_SOLVER if urgent else self._solver
        plan = solve(previous, solver=solver, time_limit=self._time_limit, min_improvement=improve,
                     work_limit=self._work_limit)  # fmt: skip
        whole_time, whole_work = self._whole_limits
        refused = goal.refuses_first_miss and first and plan.info.get("met") is False
        if refused and urgent and not goal.violation(plan.lower_bound, 0.0):
            plan = solve(None, solver=self._solver, time_limit=whole_time, work_limit=whole_work)
        return plan

    @staticmethod
    def _previous_plan(state: SweepState) -> Plan | None:
        """The waiting trials' current plan, as the planner sees it (node-local devices)."""
        previous = [state.topology.to_local(w.assignment) for w in state.waiting.values() if w.assignment is not None]
        return Plan(tuple(previous)) if previous else None


def work_limit(plan_work: WorkLimit | None) -> WorkLimit | None:
    """A plan's budget of work in a sweep that plans by work (capped at ``REPLAN_WORK``, as its time limit is capped
    at ``REPLAN_SECONDS``); None in one that plans by the wall clock."""
    return None if plan_work is None else WorkLimit(min(plan_work.units, REPLAN_WORK.units))
