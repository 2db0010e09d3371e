"""Mutations of the fixes that make a trial's end one move against every other end of it: the owner's tell on
SQLite, an orphan's end on a journal, and a retry whose enqueue's answer was lost."""

from mutations import Mutation

_RACING = (
    "tests/test_sqlite_moves.py::"
    "test_a_tell_racing_another_sweeps_end_of_its_trial_neither_overwrites_it_nor_runs_it_twice"
)
_RACES = "tests/test_orphan_end_races.py"

MUTATIONS: list[Mutation] = [
    Mutation(
        name="tell-unconditional-on-rdb",
        contract="on an RDB storage the owner's tell ends its trial only if it is still RUNNING, in one write",
        path="optuna_saturn/study/moves.py",
        old="    if not isinstance(rdb, RDBStorage):  # (the log's order",
        new="    if True:  # (the log's order",
        tests=(f"{_RACING}[sqlite]",),
    ),
    Mutation(
        name="journal-end-by-its-answer",
        contract="on a journal, the sweep whose records stand on the ended orphan is the one that queues its retry",
        path="optuna_saturn/study/moves.py",
        old="    if signed_by is None or not to.is_finished():",
        new="    if True:",
        tests=(
            f"{_RACES}::test_two_sweeps_ending_one_orphan_on_a_journal_queue_one_retry_even_when_the_winners_answer_is_lost",
        ),
    ),
    Mutation(
        name="lost-enqueue-queued-again",
        contract="a retry whose enqueue raised is looked for before it is queued again",
        path="optuna_saturn/study/ownership.py",
        old="if number not in watch.retries_tried or not _retry_queued(gateway, number):",
        new="if True:",
        tests=(f"{_RACES}::test_a_retry_whose_enqueue_landed_but_whose_answer_was_lost_is_not_queued_again",),
    ),
    Mutation(
        name="tells-stack-their-moves",
        contract="one tell's move at a time stands in for a shared storage object's write, for its own trial only",
        path="optuna_saturn/study/moves.py",
        old="    with _TELLING:\n",
        new="    with contextlib.nullcontext():\n",
        tests=(
            "tests/test_sqlite_moves.py::"
            "test_two_sweeps_in_one_process_telling_at_once_on_one_storage_keep_their_own_records",
        ),
    ),
    Mutation(
        name="journal-end-judged-by-all-records",
        contract="on a journal the name on the ended orphan decides who ended it, not all of its records",
        path="optuna_saturn/study/moves.py",
        old="    return stored.state == to and name == (attrs or {}).get(signed_by)",
        new="    return stored.state == to and all(\n"
        "        {**stored.user_attrs, **stored.system_attrs}.get(k) == v for k, v in (attrs or {}).items()\n"
        "    )",
        tests=(f"{_RACES}::test_two_sweeps_whose_record_writes_interleave_on_a_journal_leave_one_winner",),
    ),
    Mutation(
        name="outbox-tell-unconditional",
        contract="a result the outbox kept ends its trial only if it is still RUNNING",
        path="optuna_saturn/study/gateway.py",
        old="moves.tell_if_running(self.study, trial, state, values, result.attrs), state, values",
        new="self.study.tell(trial, values, state=state), state, values",
        tests=(
            "tests/test_sqlite_moves.py::"
            "test_a_result_the_outbox_kept_does_not_overwrite_another_sweeps_end_of_its_trial",
        ),
    ),
]
