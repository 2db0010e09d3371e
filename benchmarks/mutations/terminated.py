"""Mutations of a sweep the machine's scheduler ends (SIGTERM: SLURM's time limit, a pre-emption): its running and
asked trials run again in the next optimize, where Ctrl-C (you) fails them as study.optimize does."""

from mutations import Mutation

_TEST = "tests/test_interrupt.py::test_interrupt_stops_every_process_and_ends_every_trial[15]"

MUTATIONS: list[Mutation] = [
    Mutation(
        name="terminated-trials-not-run-again",
        contract="a sweep ended by SIGTERM queues its running trials' params again",
        path="optuna_saturn/sweep/loop.py",
        old="                self._abort(reason, run_again=run_again)",
        new="                self._abort(reason, run_again=False)",
        tests=(_TEST,),
    ),
    Mutation(
        name="terminated-sigterm-read-as-ctrl-c",
        contract="SIGTERM is told from Ctrl-C (Terminated), also when it came during a storage call",
        path="optuna_saturn/study/interrupts.py",
        old="    return Terminated(reason) if signum == signal.SIGTERM else KeyboardInterrupt(reason)",
        new="    return KeyboardInterrupt(reason)",
        tests=(_TEST,),
    ),
    Mutation(
        name="terminated-end-cut-in-two",
        contract="a stop signal waits until what ended is told whole (else the trial stays RUNNING for ever)",
        path="optuna_saturn/sweep/loop.py",
        old="        with signals_held():\n",
        new="        with contextlib.nullcontext():\n",
        tests=("tests/test_policy_interface.py::test_a_sigterm_while_a_trial_ends_waits_until_its_end_is_told",),
    ),
    Mutation(
        name="broken-pool-trials-not-run-again",
        contract="a pool that breaks (every node gone) queues its running trials again for the next optimize",
        path="optuna_saturn/sweep/loop.py",
        old="                run_again = isinstance(exc, (Terminated, PoolBroken))",
        new="                run_again = isinstance(exc, Terminated)",
        tests=("tests/test_policy_interface.py::test_a_pool_that_breaks_queues_its_running_trial_again",),
    ),
]
