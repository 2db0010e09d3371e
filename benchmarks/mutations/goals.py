"""Mutations of the planner's goal (Makespan, Deadline, Budget): the exact solvers see it, the validator checks it,
nothing outside the planner reads its fields, and the simulator's work limit keeps its old name for a while."""

from mutations import Mutation

_GOALS = "tests/test_goals.py"
_DEADLINE = f"{_GOALS}::test_under_a_deadline_the_exact_solvers_spend_fewer_device_seconds_than_the_heuristics"
_STAGES = "tests/test_goal_exact_stages.py"
_OVER_BUDGET_START = f"{_STAGES}::test_cpsat_finds_the_plan_within_a_budget_that_ends_later_than_an_over_budget_start"

MUTATIONS: list[Mutation] = [
    Mutation(
        name="goal-unseen-by-milp",
        contract="the block MILP bounds the end by a deadline and minimises device-seconds (the goal shapes it)",
        path="optuna_saturn/planner/_milp.py",
        old="    goal.shape(_BlockTerms(out))\n",
        new="    MAKESPAN.shape(_BlockTerms(out))\n",
        tests=(f"{_DEADLINE}[highs]",),
    ),
    Mutation(
        name="goal-unseen-by-cpsat",
        contract="CP-SAT bounds the end by a deadline and minimises device-seconds (the goal shapes it)",
        path="optuna_saturn/planner/_cpsat.py",
        old="    goal.shape(_CpTerms(m, makespan, unit, spent, least, len(jobs)))\n",
        new="    MAKESPAN.shape(_CpTerms(m, makespan, unit, spent, least, len(jobs)))\n",
        tests=(f"{_DEADLINE}[cpsat]",),
    ),
    Mutation(
        name="goal-exact-stages-skipped",
        contract="solve() under a deadline runs the exact solvers with the goal, not only the heuristics",
        path="optuna_saturn/planner/_solve.py",
        old="    for name, share, work_share in _goal_stages(solver, pruned, cluster):\n",
        new="    for name, share, work_share in []:\n",
        tests=(f"{_DEADLINE}[auto]",),
    ),
    Mutation(
        name="goal-budget-unbounded-in-cpsat",
        contract="CP-SAT keeps a budget's device-seconds as a constraint",
        path="optuna_saturn/planner/_cpsat.py",
        old="        self._m.add(self._sum() <= math.floor(device_seconds / self._step + 1e-9) + self._jobs)\n",
        new="        pass\n",
        tests=(f"{_GOALS}::test_within_a_budget_the_exact_solvers_end_earlier_than_the_heuristics[cpsat]",),
    ),
    Mutation(
        name="goal-validator-blind",
        contract="the independent validator checks a plan against its goal's constraint",
        path="optuna_saturn/planner/_validate.py",
        old="    why = goal.violation(end, spent)",
        new='    why = ""',
        tests=("tests/test_objectives.py::test_a_deadline_no_plan_meets_says_so_with_the_earliest_end",),
    ),
    Mutation(
        name="goal-field-read-outside-planner",
        contract="no module outside planner/ reads a goal's fields (the sweep asks it questions instead)",
        path="optuna_saturn/sweep/reporting.py",
        old='        out["objective"] = goal.summary()\n',
        new='        out["objective"] = {"kind": goal.name, "deadline": goal.seconds}  # type: ignore[attr-defined]\n',
        tests=(f"{_GOALS}::test_nothing_outside_the_planner_reads_a_goals_fields_or_asks_its_kind",),
    ),
    Mutation(
        name="simulate-time-limit-silent",
        contract="simulate(time_limit=) still works, with a FutureWarning naming work_limit",
        path="optuna_saturn/simulation/simulator.py",
        old="        FutureWarning,\n",
        new="        UserWarning,\n",
        tests=(f"{_GOALS}::test_the_simulators_work_limit_keeps_its_old_name_time_limit_for_a_while_with_a_warning",),
    ),
    Mutation(
        name="executor-goal-ignored",
        contract="SaturnExecutor(goal=...) plans for the goal given",
        path="optuna_saturn/executor.py",
        old="goal_of(deadline, budget, price_per_device_hour, goal=goal)",
        new="goal_of(deadline, budget, price_per_device_hour)",
        tests=(f"{_GOALS}::test_an_executor_takes_a_goal_instance_or_deadline_and_budget_but_not_both",),
    ),
    Mutation(
        name="simulate-cli-time-limit-silent",
        contract="optuna-saturn simulate --time-limit still works, and says it is deprecated for --work-limit",
        path="optuna_saturn/cli/inspecting.py",
        old='"--time-limit of simulate is deprecated: it is work units, not seconds; pass --work-limit."',
        new='""',
        tests=(
            "tests/test_cli.py::test_simulates_old_time_limit_still_works_as_its_work_limit_and_says_it_is_deprecated",
        ),
    ),
    Mutation(
        name="goal-budget-horizon-from-start",
        contract="CP-SAT's horizon under a budget reaches the cheapest plan's serial end, not only the start's end",
        path="optuna_saturn/planner/_goal.py",
        old="        return max(makespan, cheapest_end)\n",
        new="        return makespan\n",
        tests=(_OVER_BUDGET_START,),
    ),
    Mutation(
        name="goal-budget-tie-rounded-out",
        contract="CP-SAT's device-seconds, rounded up per option, keep a plan exactly at the budget",
        path="optuna_saturn/planner/_cpsat.py",
        old="        self._m.add(self._sum() <= math.floor(device_seconds / self._step + 1e-9) + self._jobs)\n",
        new="        self._m.add(self._sum() <= math.floor(device_seconds / self._step + 1e-9))\n",
        tests=(_OVER_BUDGET_START,),
    ),
    Mutation(
        name="goal-deadline-bounds-running-trials-in-milp",
        contract="the MILP's deadline bounds the planned jobs' ends, not a running trial's (as the goal and CP-SAT)",
        path="optuna_saturn/planner/_milp.py",
        old="        late = {where for where, until in bm.busy_until.items() if until > seconds}\n",
        new="        late: set = set()\n",
        tests=(
            f"{_STAGES}::test_the_milp_bounds_the_planned_jobs_by_a_deadline_not_a_running_trial_that_ends_past_it",
        ),
    ),
    Mutation(
        name="goal-exact-stages-over-work-limit",
        contract="under a goal, auto's stages share 1.5x the work limit, as solve()'s docstring says",
        path="optuna_saturn/planner/_solve.py",
        old='        return [(_milp_name(), 0.4, 0.4), ("cpsat", 1.0, 0.6)]\n',
        new='        return [(_milp_name(), 0.4, 0.4), ("cpsat", 1.0, 1.0)]\n',
        tests=(f"{_STAGES}::test_under_a_goal_the_stages_of_auto_share_one_and_a_half_times_the_work_limit",),
    ),
]
