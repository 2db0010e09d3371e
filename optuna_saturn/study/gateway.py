"""Everything a sweep says to the user's study, in one place.

Samplers and storages are used from one thread at a time: the scheduler's, and the channel's threads that answer
a worker's ``suggest`` or ``report``, all take the same lock (:attr:`StudyGateway.lock`). A trial's result is kept
on disk until the storage has it, and telling it is retried while the storage fails (:mod:`optuna_saturn.study.outbox`).
"""

from __future__ import annotations

import datetime
import itertools
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from optuna_saturn.study import claims, moves
from optuna_saturn.study.attr_writes import set_records_of, write_records
from optuna_saturn.study.claims import ATTR, Claimant
from optuna_saturn.study.log_artifacts import uploaded_log
from optuna_saturn.study.outbox import STORAGE_ERRORS, Outbox, Outgoing, retrying, transient
from optuna_saturn.study.records import record
from optuna_saturn.study.sampler_errors import as_in_optimize

_logger = optuna.logging.get_logger("optuna.saturn")


class StudyGateway:
    """``owner``: the record (:class:`~optuna_saturn.study.ownership.Owner`) that the trials this gateway asks or
    takes are owned by; None for a sweep that owns none (a simulation's)."""

    def __init__(
        self,
        study: optuna.Study,
        *,
        artifact_store: Any = None,
        outbox: Outbox | None = None,
        owner: dict[str, Any] | None = None,
        lock: threading.Lock | None = None,
    ) -> None:
        self.study = study
        self.lock = lock or threading.Lock()  # (shared with whatever else calls the study: the pricer describes)
        self._outbox = outbox
        self._artifact_store = artifact_store
        self._owner = owner
        # the RUNNING trials this gateway asked or took and has not told (number -> trial id), under a lock of
        # their own: the heartbeat reads them while a slow sampler or storage call holds the study's lock
        self._held: dict[int, int] = {}
        self._held_lock = threading.Lock()
        self._taken_over: set[int] = set()  # held trials another sweep ended, taking this one for dead
        self.stop_requested = False  # a callback called study.stop()

    def held_trials(self) -> dict[int, int]:
        """The RUNNING trials this gateway asked or took and has not ended (its heartbeat lists them), as their
        numbers and trial ids. Never waits on the study's lock."""
        with self._held_lock:
            return dict(self._held)

    def note_taken_over(self, number: int) -> None:
        """Another sweep ended held trial ``number``, taking this sweep for dead (the heartbeat saw it): its run
        is stopped, and the heartbeat lists it no more."""
        with self._held_lock:
            if self._held.pop(number, None) is not None:
                self._taken_over.add(number)
                _logger.error(
                    f"Trial {number} was ended by another sweep, which took this one for dead (a pause, a lost "
                    "connection); this sweep stops its run, and the other runs it again."
                )

    def taken_over(self) -> set[int]:
        """The trials :meth:`note_taken_over` noted."""
        with self._held_lock:
            return set(self._taken_over)

    def request_stop(self) -> None:
        """``trial.study.stop()`` in an objective, relayed: as in ``study.optimize``, no trial is asked after it."""
        self.stop_requested = True

    def ask_new(self) -> optuna.Trial:
        """A new trial, never one of the study's queue: the sweep takes those itself (:meth:`take`), in the order
        it plans them, where ``study.ask`` would take the oldest. It is created owned (``saturn:owner``), in one
        storage write, with a claim of its own: a write whose reply was lost is found by its claim, not created
        twice."""
        claim, owner = uuid.uuid4().hex, self._owner
        attrs = {ATTR + "claim": claim, **({ATTR + "owner": owner} if owner is not None else {})}
        attempts = itertools.count()

        def create() -> optuna.Trial:
            storage, study_id = self.study._storage, self.study._study_id
            with self.lock:
                self.study._thread_local.cached_all_trials = None  # (as study.ask: samplers see the newest trials)
                if next(attempts):  # (an earlier attempt failed: did its write reach the storage?)
                    for trial in storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
                        if record(trial, "claim") == claim:
                            return self._hold(trial._trial_id)
                template = FrozenTrial(
                    number=-1,
                    state=TrialState.RUNNING,
                    value=None,
                    datetime_start=datetime.datetime.now(),
                    datetime_complete=None,
                    params={},
                    distributions={},
                    user_attrs={},
                    system_attrs=attrs,
                    intermediate_values={},
                    trial_id=-1,
                )
                return self._hold(storage.create_new_trial(study_id, template_trial=template))

        return retrying(create, what="ask for a trial")

    def unfinished_store(self) -> Any:
        """The storage to read RUNNING trials from, for a look that writes nothing through Optuna's cache: past
        that cache, whose first read loads every trial of the study with all its attributes before it filters
        them by state (13.5 s on a study of 20,000 trials; the database filters them in 0.02 s). The queue is
        read through the cache: a trial taken from it is written through the cache, which must know it."""
        storage = self.study._storage
        return storage._backend if isinstance(storage, optuna.storages._CachedStorage) else storage

    def queued(self) -> list[FrozenTrial]:
        """The study's queue: its WAITING trials (``study.enqueue_trial``), oldest first."""

        def look() -> list[FrozenTrial]:
            with self.lock:
                return self.study._storage.get_all_trials(
                    self.study._study_id, deepcopy=False, states=(TrialState.WAITING,)
                )

        return retrying(look, what="look at the study's queue")

    def take(self, trial_id: int, distributions: dict[str, Any], records: dict[str, Any]) -> optuna.Trial | None:
        """Take one trial out of the queue (as ``study.ask`` takes the oldest), suggesting ``distributions``
        (its queue's fixed values) and recording ``records``; None if another process took it first.

        A take is three writes (:mod:`optuna_saturn.study.claims`): a claim on the WAITING trial, the move to
        RUNNING (the storage lets one process make it), then the owner. A write whose reply was lost is resolved
        by reading the trial back, never by guessing."""
        claimant = None if self._owner is None else Claimant(self._owner["sweep"], uuid.uuid4().hex)
        attempts = itertools.count()

        def take_now() -> optuna.Trial | None:
            with self.lock:
                storage = self.study._storage
                if not claims.take(storage, trial_id, claimant, retried=next(attempts) > 0):
                    return None
                owner = {ATTR + "owner": self._owner} if self._owner is not None else {}
                write_records(storage, trial_id, {**owner, **records})
                self.study._thread_local.cached_all_trials = None
                trial = self._hold(trial_id)
                for name, distribution in distributions.items():
                    trial._suggest(name, distribution)
                return trial

        return retrying(take_now, what="take a trial from the study's queue")

    def _hold(self, trial_id: int) -> optuna.Trial:
        """(Under the lock.) A RUNNING trial this gateway now holds."""
        trial = optuna.Trial(self.study, trial_id)
        with self._held_lock:
            self._held[trial.number] = trial_id
        return trial

    def set_attrs(self, trial: optuna.Trial | optuna.trial.FixedTrial, attrs: dict[str, Any]) -> None:
        """``saturn:``-prefixed user attributes of a trial that is still running."""

        def set_them() -> None:
            with self.lock:
                set_records_of(self.study._storage, trial, {ATTR + k: v for k, v in attrs.items()})

        retrying(set_them, what=f"set trial {trial.number}'s attributes")

    def tell(
        self,
        trial: optuna.Trial,
        state: TrialState,
        values: list[float] | None = None,
        *,
        attrs: dict[str, Any] | None = None,
        log: Path | None = None,
    ) -> FrozenTrial:
        """End a trial with its attributes. A failed trial's log goes to the artifact store, if there is one; a
        result the study refuses (say, a value of the wrong shape) fails the trial instead: the sweep goes on.
        The result is in the outbox until the storage has it (where the disk takes it: a full disk costs the copy,
        never the tell); while the storage fails, telling is retried."""
        attrs = {ATTR + key: value for key, value in (attrs or {}).items()}
        if isinstance(attrs.get(ATTR + "fail_reason"), str):
            attrs[ATTR + "fail_reason"] = capped_reason(attrs[ATTR + "fail_reason"])
        if state == TrialState.FAIL and log is not None:  # (once, before telling, and outside the study's lock)
            attrs.update(uploaded_log(self._artifact_store, trial, log))
        kept = (
            None
            if self._outbox is None
            else self._outbox.keep_if_it_can(Outgoing(trial._trial_id, trial.number, state.name, values, attrs))
        )
        with as_in_optimize(self.study) as sampler:
            frozen = retrying(
                lambda: self._tell_now(trial, state, values, attrs), what=f"record trial {trial.number}'s result"
            )
        with self._held_lock:
            self._held.pop(trial.number, None)
        if not told_here(frozen, state, values):
            self._keep_late_result(frozen, state, values)
            if kept is not None:
                assert self._outbox is not None  # (kept: what the outbox kept)
                self._outbox.set_aside(kept)  # (where no recovery clears it)
        elif kept is not None:
            Outbox.done(kept)
        self.stop_requested = self.stop_requested or sampler.stopped  # (GridSampler, its grid done, say)
        if sampler.raised:  # (the trial's end is stored: Optuna writes it, then raises, as study.optimize does)
            raise sampler.raised[0]
        return frozen

    def _keep_late_result(self, stored: FrozenTrial, state: TrialState, values: list[float] | None) -> None:
        """Someone else ended this trial before its result came (another sweep that took this one for dead, or a
        person's ``study.tell``): the result is kept, in the study (``saturn:late_result:<number>``) and in the
        outbox, never thrown away."""
        owner = (record(stored, "owner") or {}).get("sweep")
        ended_by = record(stored, "ended_by")
        who = (
            f"sweep {ended_by} had already ended it {stored.state.name}, taking this sweep ({owner}) for dead"
            if ended_by is not None and ended_by != owner
            else f"someone outside this sweep ({owner}) had already ended it {stored.state.name} (a study.tell?)"
        )
        _logger.error(
            f"Trial {stored.number} finished here ({state.name}, values {values}), but {who}. The result is kept in "
            f"the study's attribute saturn:late_result:{stored.number} and in the outbox's late/ folder; the trial is "
            "not run again by this sweep."
        )
        self.set_study_attr(f"late_result:{stored.number}", {"state": state.name, "values": values, "sweep": owner})

    def _tell_now(
        self, trial: optuna.Trial, state: TrialState, values: list[float] | None, attrs: dict[str, Any]
    ) -> FrozenTrial:
        with self.lock:  # (a trial already finished, by an attempt whose answer was lost, say, refuses the writes)
            try:
                return self._write_result(trial, state, values, attrs)
            except STORAGE_ERRORS as exc:
                if transient(exc):
                    raise
                stored = self.study._storage.get_trial(trial._trial_id)
                if stored.state.is_finished():
                    return stored
                raise
            except Exception:
                # another sweep's recovery ended the trial before these writes or between them (its records, then
                # the tell): what it stored is the trial now, and the caller keeps this result as a late one
                stored = self.study._storage.get_trial(trial._trial_id)
                if stored.state.is_finished():
                    return stored
                raise

    def _write_result(
        self, trial: optuna.Trial, state: TrialState, values: list[float] | None, attrs: dict[str, Any]
    ) -> FrozenTrial:
        try:  # (the end lands only on a RUNNING trial: another sweep's end of it in between wins, on SQLite too)
            return moves.tell_if_running(
                self.study, trial, state, values if state == TrialState.COMPLETE else None, attrs
            )
        except optuna.exceptions.UpdateFinishedTrialError:
            raise
        except Exception as exc:  # the study refused the result (a value of the wrong shape, too long): FAIL
            if isinstance(exc, STORAGE_ERRORS) and transient(exc):
                raise
            if self.study._storage.get_trial(trial._trial_id).state.is_finished():
                raise  # (not refused: ended by another sweep meanwhile)
            reason = capped_reason(f"could not record the result: {exc}")
            # (values the study refused were never written, and the records go with the FAIL; records the storage
            # refused, too long for its column, say, are left out of it)
            failed = {**(attrs if isinstance(exc, ValueError) else {}), ATTR + "fail_reason": reason}
            return moves.tell_if_running(self.study, trial, TrialState.FAIL, None, failed)

    def tell_what_the_outbox_kept(self, orphaned: Callable[[FrozenTrial], bool]) -> list[int]:
        """Tell the results an earlier sweep kept in the outbox but the storage never got, for its trials that are
        still RUNNING and whose sweep is gone (``orphaned``); drop those the storage has. Returns the numbers of
        the trials told."""
        if self._outbox is None:
            return []
        told = []
        for path, result in self._outbox.pending():
            with self.lock:
                try:
                    stored = self.study._storage.get_trial(result.trial_id)
                except KeyError:  # (another study's, with the same name before)
                    stored = None
                if stored is not None and stored.number == result.number and stored.state == TrialState.RUNNING:
                    if not orphaned(stored):
                        continue  # its sweep lives: it tells it itself
                    state = TrialState[result.state]
                    values = result.values if state == TrialState.COMPLETE else None
                    try:  # (only if it is still RUNNING then: another sweep's end in between stands)
                        trial = optuna.Trial(self.study, result.trial_id)
                        if told_here(
                            moves.tell_if_running(self.study, trial, state, values, result.attrs), state, values
                        ):
                            told.append(result.number)
                    except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
                        pass  # (another sweep sharing the outbox told it first: it is the storage's now)
            Outbox.done(path)
        if told:
            _logger.warning(
                f"Recorded the results of trial(s) {told} that an earlier sweep kept on disk "
                f"({self._outbox.folder}) while the storage was down."
            )
        return told

    def call_back(self, callbacks: Sequence[Callable[[optuna.Study, FrozenTrial], None]], trial: FrozenTrial) -> None:
        """Each callback with ``(study, frozen_trial)``, in order, as ``study.optimize`` calls them after a trial
        ends. An exception in one stops the sweep, as it stops ``study.optimize``. They run inside Optuna's
        optimize-loop flag, so ``study.stop()`` (``MaxTrialsCallback``, say) is allowed; it sets
        :attr:`stop_requested`, and the sweep stops asking."""
        if not callbacks:
            return
        local = self.study._thread_local
        was, local.in_optimize_loop, self.study._stop_flag = local.in_optimize_loop, True, False
        try:
            for callback in callbacks:
                callback(self.study, trial)
        finally:
            local.in_optimize_loop = was
            self.stop_requested = self.stop_requested or self.study._stop_flag
            self.study._stop_flag = False

    def fail(self, trial: optuna.Trial, reason: str, *, attrs: dict[str, Any] | None = None) -> FrozenTrial:
        return self.tell(trial, TrialState.FAIL, attrs={**(attrs or {}), "fail_reason": reason})

    def set_study_attr(self, key: str, value: Any, *, budget: float | None = None) -> None:
        """``budget``: seconds to retry for while the storage fails (default:
        :data:`~optuna_saturn.study.outbox.RETRY_SECONDS`)."""

        def set_it() -> None:
            with self.lock:
                self.study.set_user_attr(ATTR + key, value)

        retrying(set_it, what=f"set the study's {ATTR + key}", budget=budget)


#: The longest ``saturn:fail_reason`` kept in the study (optuna-dashboard shows it; a whole traceback of a
#: library's error can run to megabytes, and a MySQL TEXT column holds 64 KiB).
FAIL_REASON_CHARS = 2048


def capped_reason(reason: str, limit: int = FAIL_REASON_CHARS) -> str:
    """``reason`` within ``limit`` characters: its start (what failed) and its end (the error), the middle left
    out with a note of how much."""
    if len(reason) <= limit:
        return reason
    head = limit // 4
    marker = f"\n[... {len(reason) - limit} characters left out; the trial's log has them ...]\n"
    return reason[:head] + marker + reason[len(reason) - (limit - head - len(marker)) :]


def told_here(stored: FrozenTrial, state: TrialState, values: list[float] | None) -> bool:
    """Whether ``stored`` is the end this sweep told (``state`` and ``values``, or the FAIL it falls back to when
    the study refuses them), whoever wrote it: otherwise someone else ended the trial first, and this sweep's
    result is a late one, to keep."""
    if state != TrialState.COMPLETE:
        return True  # (a FAIL or PRUNED end carries no value: nothing is lost to the storage's end, whoever's)
    if stored.state == state:
        same: bool = stored.values == values  # (lists of floats, or None)
        return same
    reason = str(record(stored, "fail_reason", ""))
    return stored.state == TrialState.FAIL and reason.startswith("could not record the result")


def ended_by_another(trial: FrozenTrial) -> bool:
    """Whether a sweep other than the trial's owner ended it (recovering it as an orphan)."""
    ended_by = record(trial, "ended_by")
    owner = (record(trial, "owner") or {}).get("sweep")
    return ended_by is not None and ended_by != owner
