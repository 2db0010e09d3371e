"""Mutations of issue 47's DeepSpeed build-lock fixes: the extensions cache keyed by what builds the op, a stale
lock removed whether or not the op is built, and an op build never taken for a stall."""

from mutations import Mutation

_TESTS = "tests/test_build_locks.py"

MUTATIONS: list[Mutation] = [
    Mutation(
        name="extensions-cache-unkeyed",
        contract="the extensions cache is keyed by Python, torch, DeepSpeed, the device kind and the environment",
        path="optuna_saturn/pools/launch_commands.py",
        old=' / "torch_extensions" / build_key(kind or _machine_kind())',
        new=' / "torch_extensions"',
        tests=(
            f"{_TESTS}::test_the_extensions_cache_is_keyed_by_python_torch_deepspeed_the_device_kind_and_the_environment",
        ),
    ),
    Mutation(
        name="users-extensions-dir-ignored",
        contract="a TORCH_EXTENSIONS_DIR the user sets wins over the keyed cache",
        path="optuna_saturn/pools/launch_commands.py",
        old='    return os.environ.get("TORCH_EXTENSIONS_DIR") or str(extensions_cache(kind))',
        new="    return str(extensions_cache(kind))",
        tests=(f"{_TESTS}::test_a_users_torch_extensions_dir_wins_everywhere_the_cache_is_used",),
    ),
    Mutation(
        name="stale-lock-removed-only-when-op-missing",
        contract="a stale build lock beside a built op is removed before the pool starts",
        path="optuna_saturn/pools/deepspeed_ops.py",
        old="    remove_stale_locks(kind, folder)  # (a built op's too: every process that loads it takes its lock "
        "first)\n"
        "    builders = missing(kind, folder, configs)\n    if not builders:\n        return\n",
        new="    builders = missing(kind, folder, configs)\n    if not builders:\n        return\n"
        "    remove_stale_locks(kind, folder)\n",
        tests=(f"{_TESTS}::test_a_stale_lock_beside_a_built_op_is_removed_before_the_pool_starts",),
    ),
    Mutation(
        name="unheld-lock-judged-by-age-only",
        contract="a lock no process on the machine holds is stale past a short grace, not only after 15 min",
        path="optuna_saturn/pools/build_locks.py",
        old=" or (age > UNHELD_GRACE_SECONDS and held(path) is False)",
        new="",
        tests=(f"{_TESTS}::test_a_lock_no_process_holds_is_stale_past_a_short_grace_and_one_a_process_holds_is_kept",),
    ),
    Mutation(
        name="unreadable-holder-taken-for-none",
        contract="a lock whose holder cannot be told (an unreadable process of its owner) is not taken for unheld",
        path="optuna_saturn/pools/build_locks.py",
        old="    return None if unknown else False",
        new="    return False",
        tests=(f"{_TESTS}::test_a_lock_no_process_holds_is_stale_past_a_short_grace_and_one_a_process_holds_is_kept",),
    ),
    Mutation(
        name="op-build-counted-as-stall",
        contract="a trial silent while an op builds is not stalled; its silence counts from the build's end",
        path="optuna_saturn/sweep/faults.py",
        old="            if silent > limit and min(silent, self._since_build()) > limit:",
        new="            if silent > limit:",
        tests=(
            f"{_TESTS}::test_a_trial_silent_while_an_op_builds_is_not_stalled_and_its_silence_counts_from_the_builds_end",
        ),
    ),
    Mutation(
        name="op-build-not-seen-by-the-sweep",
        contract="a real ZeRO sweep's stall judgment sees the builds in its workers' extensions folder",
        path="optuna_saturn/sweep/faults.py",
        old="            since_build=seconds_since_a_build\n",
        new="            since_build=lambda: math.inf\n",
        tests=(f"{_TESTS}::test_a_zero_sweep_sees_the_builds_in_its_extensions_folder_and_another_sweep_does_not",),
    ),
]
