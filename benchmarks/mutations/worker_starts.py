"""Mutations of what the fake GPU node shows of a worker's life: a device whose worker cannot start
(``optuna_saturn/pools/worker_starts.py``), and memory a job leaves on its GPU."""

from mutations import Mutation

_TESTS = "tests/test_fake_gpu.py::"
MUTATIONS: list[Mutation] = [
    Mutation(
        name="given-up-device-not-told",
        contract="the host tells the pool which device it gave up on, and the sweep ends with that reason",
        path="optuna_saturn/pools/warm_host.py",
        old='        give_up(config["folder"], index, why)',
        new="        pass",
        tests=(_TESTS + "test_with_every_gpus_worker_unable_to_start_the_sweep_ends_with_the_reason",),
    ),
    Mutation(
        name="failed-start-exit-code",
        contract="a worker that stops before its hello exits with the code of a failed start, however long it took",
        path="optuna_saturn/worker/warm.py",
        old="        _exit(1 if up else COULD_NOT_START)",
        new="        _exit(1)",
        tests=(_TESTS + "test_a_gpu_whose_worker_cannot_start_is_given_up_and_the_sweep_goes_on_with_the_other_three",),
    ),
    Mutation(
        name="no-start-time-out",
        contract="a worker that never says hello is given up on after the start time-out",
        path="optuna_saturn/pools/worker_starts.py",
        old="            elif now - since > self._timeout:",
        new="            elif False:",
        tests=(_TESTS + "test_workers_that_hang_at_their_start_are_given_up_after_the_start_time_out",),
    ),
    Mutation(
        name="none-left-not-said",
        contract="with every device given up on, the pool says why no job can run (the sweep ends with it)",
        path="optuna_saturn/pools/warm.py",
        old="            return self._starts.why_none_started()",
        new="            pass",
        tests=(_TESTS + "test_workers_that_hang_at_their_start_are_given_up_after_the_start_time_out",),
    ),
]
MUTATIONS += [
    Mutation(
        name="gpu-memory-kept-between-jobs",
        contract="a worker whose GPU still holds more than 256 MiB after a job is replaced before the next job",
        path="optuna_saturn/worker/warm.py",
        old="        if leftover > LEFTOVER_BYTES:",
        new="        if False:",
        tests=(_TESTS + "test_a_worker_whose_gpu_still_holds_memory_after_a_job_is_replaced_before_the_next",),
    )
]
