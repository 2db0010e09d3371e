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
        old="    if not to.is_finished():\n        return moved",
        new="    if True:\n        return moved",
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
]
