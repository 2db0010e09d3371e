"""Mutation of the rule that a description past its limit is given up, not the trial: the trial runs, planned from
estimates, and its run's start-up limit ends a hang."""

from mutations import Mutation

MUTATIONS: list[Mutation] = [
    Mutation(
        name="slow-description-fails-the-trial",
        contract="a description past describe_timeout plans the trial from estimates and runs it",
        path="optuna_saturn/pools/describing.py",
        old="            raise DescribeTimedOut(",
        new="            raise DescribeFailed(",
        tests=("tests/test_isolation.py::test_the_objective_never_runs_in_the_executor[hang]",),
    ),
    Mutation(
        name="slow-descriptions-described-for-ever",
        contract="after two descriptions past describe_timeout, no trial is described again",
        path="optuna_saturn/pricing/descriptions.py",
        old="if not self._nothing_to_describe and self._timed_out < TIMEOUTS_BEFORE_ESTIMATES:",
        new="if not self._nothing_to_describe:",
        tests=("tests/test_profiler.py::test_after_two_descriptions_past_their_limit_no_trial_is_described_again",),
    ),
]
