"""Mutations of the GPU check's own contracts (issue 46, item 5): what it may take, its pinned wheels, and what it
judges on a GPU (memory held between jobs, where each trial ran, a DeepSpeed that does not import, the two-GPU
parts on one GPU)."""

from mutations import Mutation

_TESTS = "tests/test_gpu_check_script.py::"

MUTATIONS: list[Mutation] = [
    Mutation(
        name="check-budget-over-a-rerun",
        contract="check.sh's default budget lets it run twice in a lent GPU's 15 minutes (at most 420 s)",
        path="benchmarks/gpu/check.sh",
        old="BUDGET=${GPU_CHECK_BUDGET:-420}",
        new="BUDGET=${GPU_CHECK_BUDGET:-660}",
        tests=(_TESTS + "test_the_check_with_its_set_up_fits_twice_in_a_lent_gpus_fifteen_minutes",),
    ),
    Mutation(
        name="review-caps-over-its-share",
        contract="the review's parts on one GPU add up within check.sh's share for them",
        path="benchmarks/gpu/review_checks.py",
        old='"C2": Part("checks_review", 45, 60),',
        new='"C2": Part("checks_review", 120, 60),',
        tests=(_TESTS + "test_the_check_with_its_set_up_fits_twice_in_a_lent_gpus_fifteen_minutes",),
    ),
    Mutation(
        name="pydantic-unpinned",
        contract="every wheel the GPU machine installs (--no-deps) is pinned, pydantic's too",
        path="benchmarks/gpu/wheels.txt",
        old="pydantic==2.14.4\n",
        new="pydantic\n",
        tests=(_TESTS + "test_every_wheel_the_gpu_machine_installs_is_pinned_and_the_exact_pins_agree",),
    ),
    Mutation(
        name="pydantic-core-off-pydantics-pin",
        contract="the pinned wheels import together: pydantic-core is the one pydantic requires",
        path="benchmarks/gpu/wheels.txt",
        old="pydantic-core==2.50.5\n",
        new="pydantic-core==2.46.4\n",
        tests=(_TESTS + "test_every_wheel_the_gpu_machine_installs_is_pinned_and_the_exact_pins_agree",),
    ),
    Mutation(
        name="cublas-workspace-counted",
        contract="C2 reads what a GPU holds between jobs after clearing cuBLAS's workspaces",
        path="benchmarks/gpu/review_objectives.py",
        old="        torch._C._cuda_clearCublasWorkspaces()\n",
        new="        pass\n",
        tests=(_TESTS + "test_a_trial_reads_what_its_gpu_holds_once_cublas_workspaces_are_cleared",),
    ),
    Mutation(
        name="no-reserved-tolerance",
        contract="C2 tolerates the workspaces the allocator keeps reserved, up to a stated bound",
        path="benchmarks/gpu/checks_review.py",
        old="RESERVED_TOLERANCE = 64 * 2**20",
        new="RESERVED_TOLERANCE = 0",
        tests=(_TESTS + "test_a_cublas_workspace_is_no_leftover_and_any_allocated_byte_is",),
    ),
    Mutation(
        name="placement-ignores-the-mask",
        contract="each trial's CUDA_VISIBLE_DEVICES must be its pool entry, as it recorded from inside itself",
        path="benchmarks/gpu/checks_common.py",
        old='        if seen != (expected_visible, "0", device):',
        new='        if seen[1:] != ("0", device):',
        tests=(_TESTS + "test_a_trial_off_its_pool_entry_is_misplaced",),
    ),
    Mutation(
        name="broken-deepspeed-skipped",
        contract="an installed DeepSpeed that does not import FAILs its parts with the reason, never SKIPs them",
        path="benchmarks/gpu/checks_common.py",
        old='check(part, "SKIP" if found["state"] == "absent" else "FAIL",',
        new='check(part, "SKIP",',
        tests=(_TESTS + "test_a_deepspeed_that_does_not_import_fails_its_parts_with_the_reason",),
    ),
    Mutation(
        name="two-gpu-parts-run-on-one",
        contract="the two-GPU parts say SKIP with the reason on fewer than two GPUs",
        path="benchmarks/gpu/review_checks.py",
        old="    if part.gpus > 1 and not dry and gpus < part.gpus:",
        new="    if False:",
        tests=(_TESTS + "test_the_two_gpu_parts_say_skip_with_the_reason_on_one_gpu",),
    ),
]
