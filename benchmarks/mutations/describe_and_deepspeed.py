"""Mutations of issue 46's describing and DeepSpeed contracts: a mixed-precision Trainer described while the GPUs
are hidden, no CUDA check in the executor, ZeRO's buckets sized to the model and the device, DeepSpeed's ops built
before the pool."""

from mutations import Mutation

_DESCRIBE = "tests/test_describe_hidden_gpus.py"
_BUCKETS = "tests/test_deepspeed_buckets.py"
_OPS = "tests/test_deepspeed_ops_needed.py"

MUTATIONS: list[Mutation] = [
    Mutation(
        name="trainer-bf16-check-answered-while-hidden",
        contract="TrainingArguments(bf16=True) is described while the GPUs are hidden (not planned from estimates)",
        path="optuna_saturn/profiler/_transformers_hidden.py",
        old="        setattr(module, _BF16_CHECK, _bf16_taken_as_available)\n",
        new="        pass\n",
        tests=(
            f"{_DESCRIBE}::test_a_mixed_precision_trainer_is_described_where_transformers_is_already_imported",
            f"{_DESCRIBE}::test_a_bf16_trainer_trial_is_profiled_from_its_description",
        ),
    ),
    Mutation(
        name="trainer-bf16-check-answered-when-imported-while-hidden",
        contract="the bf16 check is answered too where the objective itself imports transformers (the describer)",
        path="optuna_saturn/profiler/_transformers_hidden.py",
        old="        sys.meta_path.insert(0, hook)\n",
        new="        pass\n",
        tests=(
            f"{_DESCRIBE}::test_a_mixed_precision_trainer_is_described_while_transformers_is_imported_by_the_objective",
        ),
    ),
    Mutation(
        name="hidden-gpu-answers-forgotten",
        contract="what transformers caches about the hardware while the GPUs are hidden does not reach the workers",
        path="optuna_saturn/profiler/_transformers_hidden.py",
        old="                probe.cache_clear()\n",
        new="                pass\n",
        tests=(
            f"{_DESCRIBE}::test_what_transformers_caches_about_the_hidden_gpus_is_forgotten_when_they_are_shown_again",
        ),
    ),
    Mutation(
        name="describe-state-restored-with-gpus-hidden",
        contract="the executor never initialises CUDA: the state put back after describing (dynamo.reset) sees no GPU",
        path="optuna_saturn/profiler/_probe.py",
        old="    with without_gpus(), contextlib.nullcontext() if throwaway else restored_process_state():\n",
        new="    with contextlib.nullcontext() if throwaway else restored_process_state(), without_gpus():\n",
        tests=(f"{_DESCRIBE}::test_describing_makes_no_cuda_check_with_the_gpus_in_sight",),
    ),
    Mutation(
        name="gpus-in-sight-counted-by-nvml",
        contract="the executor never initialises CUDA: DeepSpeed's accelerator is picked from NVML's count",
        path="optuna_saturn/profiler/_without_gpus.py",
        old='"cuda" if visible_gpu_count() else "cpu"',
        new='"cuda" if torch.cuda.device_count() else "cpu"',
        tests=(f"{_DESCRIBE}::test_describing_makes_no_cuda_check_with_the_gpus_in_sight",),
    ),
    Mutation(
        name="zero3-buckets-by-the-hidden-size",
        contract="ZeRO-3's buckets are the hidden size squared, not the largest parameter (an LM's embedding)",
        path="optuna_saturn/engines/_deepspeed_buckets.py",
        old="        h = hidden_size(model)\n",
        new="        h = int(max(p.numel() for p in model.parameters()) ** 0.5)\n",
        tests=(f"{_BUCKETS}::test_zero3_buckets_are_the_hidden_size_squared_not_the_embedding",),
    ),
    Mutation(
        name="zero12-buckets-by-the-devices-memory",
        contract="ZeRO-1/2's reduce buckets (two with overlap_comm) take at most 1/64 of the device's memory",
        path="optuna_saturn/engines/_deepspeed_buckets.py",
        old="    if device_memory:\n",
        new="    if False:\n",
        tests=(f"{_BUCKETS}::test_zero12_reduce_buckets_take_a_64th_of_the_devices_memory_at_most",),
    ),
    Mutation(
        name="zero12-buckets-by-the-models-size",
        contract="ZeRO-1/2's reduce buckets are no larger than the model's gradients",
        path="optuna_saturn/engines/_deepspeed_buckets.py",
        old="    bucket = min(total, DEEPSPEED_REDUCE_BUCKET)\n",
        new="    bucket = DEEPSPEED_REDUCE_BUCKET\n",
        tests=(f"{_BUCKETS}::test_zero12_reduce_buckets_are_no_larger_than_the_models_gradients",),
    ),
    Mutation(
        name="zero12-buckets-sized-by-the-engine",
        contract="the DeepSpeed engine sizes ZeRO-1/2's buckets too (with its GPU's memory), not only ZeRO-3's",
        path="optuna_saturn/engines/_deepspeed.py",
        old='        if "zero_optimization" in config:\n',
        new="        if self.stage >= 3:\n",
        tests=(f"{_BUCKETS}::test_a_zero2_engine_hands_deepspeed_buckets_sized_to_its_devices_memory",),
    ),
    Mutation(
        name="offload-steps-deepspeeds-cpu-adam",
        contract="under ZeRO-Offload on a GPU, DeepSpeedCPUAdam steps for the user's Adam/AdamW",
        path="optuna_saturn/engines/_deepspeed.py",
        old="optimizer = host_optimizer(optimizer, ",
        new="optimizer = (lambda o, *_: o)(optimizer, ",
        tests=(f"{_OPS}::test_a_zero_offload_engine_hands_deepspeed_its_cpu_adam",),
    ),
    Mutation(
        name="cpu-adam-keeps-the-users-groups",
        contract="the swapped optimizer steps the user's own parameter groups (a scheduler on them still applies)",
        path="optuna_saturn/engines/_offload_optimizer.py",
        old="        optimizer.param_groups,  # (the same dicts",
        new="        [dict(g) for g in optimizer.param_groups],  # (the same dicts",
        tests=(f"{_OPS}::test_offload_on_a_gpu_steps_deepspeeds_cpu_adam_over_the_users_own_groups",),
    ),
    Mutation(
        name="cpu-adam-only-where-built",
        contract="a trial never compiles cpu_adam: without it built, the user's optimizer steps",
        path="optuna_saturn/engines/_offload_optimizer.py",
        old="    if not cpu_adam_is_built():\n",
        new="    if False:\n",
        tests=(f"{_OPS}::test_the_users_optimizer_steps_where_deepspeeds_would_not_compute_the_same",),
    ),
    Mutation(
        name="gpu-ops-built-before-the-pool",
        contract="on GPUs, cpu_adam (offload) and fused_adam (a config-named Adam) are built before the pool",
        path="optuna_saturn/pools/deepspeed_ops.py",
        old='    "cuda": {"CPUAdamBuilder": "cpu_adam", "FusedAdamBuilder": "fused_adam"},\n',
        new='    "cuda": {},\n',
        tests=(f"{_OPS}::test_the_ops_built_first_are_those_the_sweeps_strategies_need_on_its_devices",),
    ),
    Mutation(
        name="ops-chosen-by-the-sweeps-strategies",
        contract="the pool builds the ops its sweep's strategies need, before its first job",
        path="optuna_saturn/pools/warm.py",
        old=", configs=self._deepspeed_configs\n",
        new="\n",
        tests=(f"{_OPS}::test_an_op_a_strategy_needs_is_built_before_the_pools_first_job",),
    ),
]
