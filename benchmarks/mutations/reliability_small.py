"""Mutations of issue 47's small reliability fixes (arguments refused up front, copied attributes, lease files,
temporary folders of dead executors)."""

from mutations import Mutation

_ARGS = "tests/test_executor_args.py"

MUTATIONS: list[Mutation] = [
    Mutation(
        name="devices-float-unchecked",
        contract="devices=2.5 is refused with a ValueError naming a whole number, not a TypeError from list()",
        path="optuna_saturn/executor_arguments.py",
        old="    check_devices(devices)\n",
        new="",
        tests=(f"{_ARGS}::test_bad_executor_arguments_are_refused_by_the_constructor_with_the_fix",),
    ),
    Mutation(
        name="nan-limits-accepted",
        contract="a NaN or negative plan_time_limit or grace_period is refused by the constructor",
        path="optuna_saturn/executor_arguments.py",
        old="if is_number(value) and math.isfinite(value) and (value > 0 or (zero_ok and value == 0)):",
        new="if not value < 0:",
        tests=(f"{_ARGS}::test_bad_executor_arguments_are_refused_by_the_constructor_with_the_fix",),
    ),
    Mutation(
        name="nan-timeout-accepted",
        contract="optimize(timeout=nan) is refused before anything starts",
        path="optuna_saturn/optimize_arguments.py",
        old="if timeout is not None and not (is_number(timeout) and timeout > 0):",
        new="if timeout is not None and timeout <= 0:",
        tests=(f"{_ARGS}::test_bad_arguments_are_rejected_before_anything_starts",),
    ),
]
