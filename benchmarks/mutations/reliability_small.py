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

_COPIED = "tests/test_copied_attributes.py"
MUTATIONS += [
    Mutation(
        name="copied-retry-of-looked-up",
        contract="a copied saturn:retry_of naming no earlier trial of this study is warned of, never looked up",
        path="optuna_saturn/study/earlier_run.py",
        old="    except KeyError:\n",
        new="    except ZeroDivisionError:\n",
        tests=(
            f"{_COPIED}::test_a_foreign_retry_of_is_warned_of_and_the_trial_runs_as_a_new_one",
            f"{_COPIED}::test_a_copied_retry_of_queued_during_a_sweep_runs_as_a_new_trial_and_stops_nothing",
        ),
    ),
    Mutation(
        name="later-retry-of-followed",
        contract="a saturn:retry_of naming a later trial is no run again of it",
        path="optuna_saturn/study/earlier_run.py",
        old="    if earlier.number >= trial.number:",
        new="    if earlier.number < 0:",
        tests=(f"{_COPIED}::test_a_foreign_retry_of_is_warned_of_and_the_trial_runs_as_a_new_one",),
    ),
    Mutation(
        name="copied-retry-of-complete-followed",
        contract="a saturn:retry_of naming a trial that did not fail is no run again of it",
        path="optuna_saturn/study/earlier_run.py",
        old="    if earlier.state != TrialState.FAIL:",
        new="    if earlier.state == TrialState.WAITING:",
        tests=(f"{_COPIED}::test_a_foreign_retry_of_is_warned_of_and_the_trial_runs_as_a_new_one",),
    ),
    Mutation(
        name="copied-retry-of-other-params-followed",
        contract="a saturn:retry_of naming a failed trial of other params is no run again of it",
        path="optuna_saturn/study/earlier_run.py",
        old="    if fixed is not None and fixed != earlier.params:",
        new="    if fixed is None:",
        tests=(f"{_COPIED}::test_a_foreign_retry_of_is_warned_of_and_the_trial_runs_as_a_new_one",),
    ),
    Mutation(
        name="copied-retries-counted",
        contract="a copied saturn:retries does not count against max_retries",
        path="optuna_saturn/study/earlier_run.py",
        old='record(trial, "retries", 0) if is_retry else 0',
        new='record(trial, "retries", 0)',
        tests=(f"{_COPIED}::test_a_foreign_retry_of_is_warned_of_and_the_trial_runs_as_a_new_one",),
    ),
]

_LEASES = "tests/test_leases.py"
MUTATIONS += [
    Mutation(
        name="lease-made-under-umask",
        contract="a lease file is made 0666 in one step, never private to a creator killed before its lock",
        path="optuna_saturn/leases.py",
        old="            _create_open_to_all(path)  # (or another sweep made it meanwhile: either way, open it now)\n",
        new=(
            "            with contextlib.suppress(FileExistsError):\n"
            "                os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666))\n"
        ),
        tests=(f"{_LEASES}::test_a_lease_file_is_open_to_every_user_even_if_its_creator_dies_before_its_lock",),
    ),
    Mutation(
        name="lease-linked-before-opened-to-all",
        contract="the lease file is opened to all before it gets its name",
        path="optuna_saturn/leases.py",
        old="    try:\n        os.fchmod(descriptor, 0o666)\n",
        new="    try:\n",
        tests=(f"{_LEASES}::test_a_lease_file_is_open_to_every_user_even_if_its_creator_dies_before_its_lock",),
    ),
    Mutation(
        name="lease-full-disk-bare-oserror",
        contract="a lease folder that takes no file is said with the folder and OPTUNA_SATURN_LEASES",
        path="optuna_saturn/leases.py",
        old="    except PermissionError:\n        raise\n    except OSError as exc:",
        new="    except OSError:\n        raise\n    except ValueError as exc:",
        tests=(f"{_LEASES}::test_a_lease_folder_that_takes_no_file_says_so_and_names_the_way_around",),
    ),
]

_TEMP = "tests/test_temp_folders.py"
MUTATIONS += [
    Mutation(
        name="dead-sweeps-folders-kept",
        contract="every sweep removes, at its start, the temporary folders of executors that were killed",
        path="optuna_saturn/channel.py",
        old="        remove_dead_sweeps_folders()  # (executors killed before they could remove theirs)\n",
        new="",
        tests=(f"{_TEMP}::test_the_next_sweep_removes_a_killed_executors_folder_and_leaves_a_live_ones",),
    ),
    Mutation(
        name="sweep-folder-owner-by-pid-only",
        contract="a folder's owner is judged by pid and start time: a reused pid does not keep it",
        path="optuna_saturn/temp_folders.py",
        old="    return ticks is not None and start_ticks(pid) != ticks",
        new="    return False",
        tests=(f"{_TEMP}::test_a_folder_whose_pid_was_given_to_a_later_process_is_removed",),
    ),
    Mutation(
        name="sweep-folder-of-another-namespace-judged",
        contract="a folder whose owner is in another PID namespace is left alone (its pid means another process)",
        path="optuna_saturn/temp_folders.py",
        old="    if not namespace or namespace != pid_namespace():",
        new="    if False:",
        tests=(f"{_TEMP}::test_folders_that_are_not_a_dead_sweeps_of_this_user_are_left_alone",),
    ),
    Mutation(
        name="sweep-folder-of-another-user-removed",
        contract="only this user's folders are removed (caught where the tests run as root, which can chown)",
        path="optuna_saturn/temp_folders.py",
        old=" and info.st_uid == os.getuid()",
        new="",
        tests=(f"{_TEMP}::test_folders_that_are_not_a_dead_sweeps_of_this_user_are_left_alone",),
    ),
]
