"""Mutations of the policies' one interface: the loop calls the hooks of every policy in the list that assemble()
builds and has what they return carried out, a rule added to the list runs, and every kind of decision has a
handler before a sweep starts."""

from mutations import Mutation

MUTATIONS: list[Mutation] = [
    Mutation(
        name="policies-faults-left-out-of-the-list",
        contract="every policy in assemble()'s list is called: faults run again a trial whose rank died",
        path="optuna_saturn/sweep/assemble.py",
        old="        Faults.for_sweep(settings, may_leave_out=describes, taken_over=gateway.taken_over),\n",
        new="",
        tests=(
            "tests/test_scheduler.py::test_a_trial_whose_rank_dies_ends_on_the_death_and_runs_again_counted_beside_n_trials",
        ),
    ),
    Mutation(
        name="policies-hook-decisions-not-carried-out",
        contract="the decisions a hook returns are carried out, in order",
        path="optuna_saturn/sweep/policy.py",
        old="        for decision in decisions:\n            carry_out(decision)\n",
        new="        for decision in decisions:\n            pass\n",
        tests=(
            "tests/test_policy_interface.py::"
            "test_a_policy_added_to_the_list_is_called_each_round_and_its_decisions_are_carried_out",
        ),
    ),
    Mutation(
        name="policies-more-policies-ignored",
        contract="assemble(more_policies=...) adds rules to the list the loop iterates",
        path="optuna_saturn/sweep/assemble.py",
        old="        *more_policies,\n",
        new="",
        tests=(
            "tests/test_policy_interface.py::"
            "test_a_policy_added_to_the_list_is_called_each_round_and_its_decisions_are_carried_out",
        ),
    ),
    Mutation(
        name="policies-effects-built-without-a-handler",
        contract="the effects refuse to be built while a kind of decision has no handler (not a KeyError mid-sweep)",
        path="optuna_saturn/sweep/effects/__init__.py",
        old="        if wrong or set(declared) != set(get_args(Decision)):",
        new="        if False:",
        tests=(
            "tests/test_policy_interface.py::"
            "test_the_effects_refuse_to_be_built_while_a_kind_of_decision_has_no_handler",
        ),
    ),
    Mutation(
        name="policies-more-policies-after-the-settling-ones",
        contract="a caller's rule sees every job's end: it stands before the policies that settle ends",
        path="optuna_saturn/sweep/assemble.py",
        old="        *more_policies,\n        profiling,\n",
        new="        profiling,\n",
        tests=(
            "tests/test_policy_interface.py::test_a_policy_added_to_the_list_sees_every_trials_end_before_it_is_settled",
        ),
    ),
]
