"""Mutations of issue 47's full-disk and start-up fixes (N2: the outbox is a fallback; N11: a first step is
awaited for a limit too)."""

from mutations import Mutation

_DISK = "tests/test_full_disk.py"
_START = "tests/test_first_step_limit.py"

MUTATIONS: list[Mutation] = [
    Mutation(
        name="outbox-write-not-a-fallback",
        contract="a result the full disk cannot keep in the outbox is still told to a healthy storage",
        path="optuna_saturn/study/gateway.py",
        old="else self._outbox.keep_if_it_can(Outgoing(",
        new="else self._outbox.keep(Outgoing(",
        tests=(f"{_DISK}::test_a_full_disk_under_log_dir_costs_no_result_and_the_sweep_says_so_once",),
    ),
    Mutation(
        name="full-disk-said-every-time",
        contract="the sweep says once, not at every tell, that the disk refuses the outbox's writes",
        path="optuna_saturn/study/outbox.py",
        old="            if not self._said_refused:\n",
        new="            if True:\n",
        tests=(
            f"{_DISK}::test_a_result_the_full_disk_cannot_keep_is_not_kept_and_its_partial_file_is_gone",
            f"{_DISK}::test_a_full_disk_under_log_dir_costs_no_result_and_the_sweep_says_so_once",
        ),
    ),
    Mutation(
        name="outbox-partial-left-on-full-disk",
        contract="an outbox write cut by a full disk removes its partial file",
        path="optuna_saturn/study/outbox.py",
        old="            partial.unlink(missing_ok=True)  # (a cut write frees what it took on a full disk)\n",
        new="",
        tests=(f"{_DISK}::test_a_result_the_full_disk_cannot_keep_is_not_kept_and_its_partial_file_is_gone",),
    ),
    Mutation(
        name="checkpoint-refused-taken-for-the-objective",
        contract="a checkpoint the full disk refuses ends only its trial, FAIL with the reason; optimize goes on",
        path="optuna_saturn/worker/rank.py",
        old="    CheckpointNotWritten,\n",
        new="",
        tests=(f"{_DISK}::test_a_checkpoint_the_full_disk_refuses_ends_only_its_trial_with_the_reason",),
    ),
    Mutation(
        name="checkpoint-refused-not-named",
        contract="a checkpoint the disk refuses is said as such (a full disk, checkpoint_dir=), not as a bare OSError",
        path="optuna_saturn/training/training_trial.py",
        old="        except OSError as exc:  # (a full disk ends this trial alone",
        new="        except ValueError as exc:  # (a full disk ends this trial alone",
        tests=(f"{_DISK}::test_a_checkpoint_the_full_disk_refuses_ends_only_its_trial_with_the_reason",),
    ),
    Mutation(
        name="log-write-refused-taken-for-the-objective",
        contract="a log write the full disk refuses ends only its trial, FAIL with the reason; optimize goes on",
        path="optuna_saturn/worker/rank.py",
        old=" and not _disk_full(exc):\n",
        new=":\n",
        tests=(f"{_DISK}::test_a_log_write_the_full_disk_refuses_ends_only_its_trial_with_the_reason",),
    ),
    Mutation(
        name="first-step-reason-as-a-stall",
        contract="a trial stopped before its first step says so, with its start-up limit and how to raise it",
        path="optuna_saturn/sweep/startup.py",
        old="    if run.session.last_progress_at is not None:\n",
        new="    if True:\n",
        tests=(
            f"{_START}::test_the_start_up_limit_is_the_stall_limit_plus_the_planned_runtime_and_its_stop_says_how_to_raise_it",
            f"{_START}::test_a_trial_that_never_takes_its_first_step_ends_fail_after_its_start_up_limit_and_frees_its_device",
        ),
    ),
    Mutation(
        name="start-up-limit-ignores-its-share",
        contract="the start-up limit scales with the run's planned runtime (a long start-up is not cut at the floor)",
        path="optuna_saturn/sweep/startup.py",
        old="    share = STARTUP_SHARE * planned if math.isfinite(planned) else 0.0",
        new="    share = 0.0",
        tests=(
            f"{_START}::test_the_start_up_limit_is_the_stall_limit_plus_the_planned_runtime_and_its_stop_says_how_to_raise_it",
        ),
    ),
    Mutation(
        name="start-up-not-limited",
        contract="a trial that never takes its first step is stopped after its start-up limit and frees its devices",
        path="optuna_saturn/sweep/faults.py",
        old="                silent, limit = now - run.started, startup_limit(run, limit)\n",
        new='                silent, limit = now - run.started, float("inf")\n',
        tests=(
            f"{_START}::test_a_trial_that_never_takes_its_first_step_ends_fail_after_its_start_up_limit_and_frees_its_device",
        ),
    ),
]
