"""Mutations of issue 47's full-disk and start-up fixes (N2: the outbox is a fallback; N11: a first step is
awaited for a limit too)."""

from mutations import Mutation

_DISK = "tests/test_full_disk.py"

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
]
