"""Mutations of issue 36's GPU contracts (placement, fork safety, silent deaths, out of memory on every rank)."""

from mutations import Mutation

MUTATIONS: list[Mutation] = [
    Mutation(
        name="local-rank-is-the-rank",
        contract="LOCAL_RANK is the ordinal of the one GPU a worker sees (0), not the job's rank",
        path="optuna_saturn/worker/gpu.py",
        old='"LOCAL_RANK": "0",',
        new='"LOCAL_RANK": str(rank),',
        tests=("tests/test_gpu_contracts.py::test_every_rank_sees_one_device_and_the_variables_a_launcher_sets",),
    )
]
MUTATIONS += [
    Mutation(
        name="no-per-worker-mask",
        contract="each local-pool worker sees its own GPU alone (CUDA_VISIBLE_DEVICES set at its start)",
        path="optuna_saturn/worker/warm.py",
        old="    own_gpu(entry)\n",
        new="",
        tests=("tests/test_fake_gpu.py::test_each_rank_of_the_local_pool_runs_on_its_own_gpu_of_a_fake_four_gpu_node",),
    ),
    Mutation(
        name="no-per-actor-mask",
        contract="each Ray actor sees the GPU Ray gave it alone, also where Ray leaves the mask alone",
        path="optuna_saturn/pools/ray_actor.py",
        old="            own_gpu(self._gpu)\n",
        new="",
        tests=(
            "tests/test_fake_gpu.py::test_each_ray_actor_runs_on_the_gpu_ray_gave_it_when_ray_leaves_the_mask_alone",
        ),
    ),
    Mutation(
        name="fork-after-cuda",
        contract="a host that initialised CUDA starts its workers as fresh interpreters, not forks",
        path="optuna_saturn/pools/warm_host.py",
        old='    return why_not_fork(devices, one_process=bool(config.get("one_process")))',
        new="    return None",
        tests=("tests/test_gpu_contracts.py::test_a_host_that_initialised_cuda_starts_its_workers_fresh_and_says_why",),
    ),
    Mutation(
        name="silent-death",
        contract="a worker that stops on an error exits non-zero with its traceback, never a silent 0",
        path="optuna_saturn/worker/warm.py",
        old="        _exit(1 if up else COULD_NOT_START)",
        new="        _exit(0)",
        tests=("tests/test_gpu_contracts.py::test_a_worker_that_cannot_start_says_why_in_its_log_and_its_exit_code",),
    ),
    Mutation(
        name="profile-oom-on-rank-1-unrecorded",
        contract="an out-of-memory on any rank of a profiling job is recorded by that rank",
        path="optuna_saturn/worker/rank.py",
        old="            if out_of_memory:\n                record_failure(",
        new="            if False:\n                record_failure(",
        tests=(
            "tests/test_gpu_contracts.py::"
            "test_out_of_memory_on_rank_1_tries_more_micro_batches_and_is_never_run_again_as_it_was",
        ),
    ),
]
MUTATIONS += [
    Mutation(
        name="accelerate-bf16-not-autocast",
        contract="bf16 asked of Accelerate computes in bfloat16 under every strategy (the prepared forward autocasts)",
        path="optuna_saturn/integrations/accelerate.py",
        old="                self._autocast_forward(trial._engine.user_module(result))",
        new="                pass",
        tests=("tests/test_mixed_precision.py -k Accelerate-singlex1",),
    )
]
