"""Who runs a sweep's RUNNING trials, so that another sweep can tell a trial whose executor died from one that
a live sweep is running, and run the dead one's trials again.

Why not Optuna's heartbeats: ``RetryHeartbeatStaleTrialCallback`` works only inside ``study.optimize`` and with
RDB storage. Here every trial a sweep asks or takes records its owner (``saturn:owner``: the sweep's id, host,
pid, the process's start time, which tells a reused pid apart, and its boot and PID namespace), and the sweep
writes a heartbeat that lists its trials (:mod:`optuna_saturn.study.liveness`). Both are plain user attributes:
any persistent storage (RDB, Journal) carries them, and two executors never write the same key.

A RUNNING trial is an orphan when its owner is gone: judged by its pid only where the pid means the same process
(the same host, boot and PID namespace: two containers on one host, or a restarted machine, reuse pids), and
from anywhere else by a heartbeat that ended, or stopped changing for the stale period. It is one too when no
live sweep has listed it for the stale period (a take cut short left it RUNNING, claimed, and owned by no one).
Every live sweep looks, at its start and every :data:`RECOVER_SECONDS`; two that end one orphan at once do no
harm: only the one whose write ended it queues it again.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import optuna
import psutil
from optuna.trial import FrozenTrial, TrialState, create_trial

from optuna_saturn.process_ids import boot_id, pid_namespace
from optuna_saturn.study import claims, liveness, moves
from optuna_saturn.study.gateway import ATTR, StudyGateway
from optuna_saturn.study.liveness import HeartbeatWatch
from optuna_saturn.study.outbox import STORAGE_ERRORS
from optuna_saturn.study.records import record, split

_logger = optuna.logging.get_logger("optuna.saturn")

#: How often a running sweep looks for the trials of sweeps on its study that died (besides at its start).
RECOVER_SECONDS = 30.0


@dataclass(frozen=True)
class Owner:
    """The executor process that runs a sweep."""

    sweep: str
    host: str
    pid: int
    started: float  # the process's start time (psutil): a pid reused by another process has another
    boot: str = ""  # the kernel's boot id: after a reboot, pids mean other processes
    pid_namespace: str = ""  # "pid:[<inode>]": in another PID namespace (a container), pids mean other processes

    @classmethod
    def of_this_process(cls) -> Owner:
        me = psutil.Process()
        return cls(uuid.uuid4().hex[:12], socket.gethostname(), me.pid, me.create_time(), boot_id(), pid_namespace())

    @classmethod
    def from_json(cls, data: dict) -> Owner:
        return cls(
            str(data["sweep"]),
            str(data["host"]),
            int(data["pid"]),
            float(data["started"]),
            str(data.get("boot", "")),
            str(data.get("pid_namespace", "")),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def heartbeat_key(self) -> str:
        return liveness.heartbeat_key(self.sweep)

    def same_machine_as(self, judge: Owner) -> bool:
        """Whether this owner's pid means the same process to ``judge``: the same host, boot and PID namespace."""
        return (
            self.host == judge.host
            and bool(self.boot)
            and self.boot == judge.boot
            and bool(self.pid_namespace)
            and self.pid_namespace == judge.pid_namespace
        )

    def gone(self, beat: Any, watch: HeartbeatWatch, *, judge: Owner) -> str | None:
        """Why this owner is gone, as ``judge`` (the sweep that asks, in this process) sees it, or None while it
        may still run its trials. ``beat``: its heartbeat as stored now (None: none, or it ended)."""
        where = f"its executor (pid {self.pid} on {self.host})"
        if beat is None and self.sweep not in liveness.RUNNING_HERE:
            # (a sweep writes its first beat before it asks a trial, and nulls it when it ends: a process that
            # lives on, a notebook's kernel, says nothing of its sweep)
            return f"{where} has no heartbeat: its sweep ended, or never started one"
        if self.same_machine_as(judge):
            lives = self._process_lives()
            if lives and self.pid == judge.pid and self.sweep not in liveness.RUNNING_HERE:
                return f"its sweep {self.sweep} ended in this process (pid {self.pid}) without ending it"
            if lives is not None:
                return None if lives else f"{where} is gone"
            # (its /proc entry is hidden from this user: the heartbeat decides)
        silent = watch.silent_for(self.heartbeat_key, beat)
        if silent >= liveness.STALE_AFTER_SECONDS:
            return f"{where} is silent for {silent:.0f} s: its heartbeat has not changed since this sweep first saw it"
        return None

    def _process_lives(self) -> bool | None:
        """Whether this owner's process still runs (its pid, started when it says, within 2 s: the start time is
        computed from the wall clock, which an NTP step or a VM's resume moves); None if this user may not see it
        (``/proc`` mounted ``hidepid``)."""
        try:
            process = psutil.Process(self.pid)
            lives: bool = abs(process.create_time() - self.started) < 2.0 and process.status() != psutil.STATUS_ZOMBIE
            return lives  # (psutil has no types here)
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied:
            return None


def recover_orphans(
    gateway: StudyGateway, me: Owner, *, max_retries: int, watch: HeartbeatWatch | None = None
) -> list[int]:
    """End every RUNNING trial that is an orphan (see the module's docstring) as FAIL, with the reason, and
    enqueue its params again (``saturn:retry_of``) unless it was retried ``max_retries`` times already. Trials of
    live sweeps, and trials no sweep owns or claimed (a plain ``study.optimize``'s), are left alone. ``watch``:
    what this sweep saw at its earlier recoveries (a fresh one sees no heartbeat stop). Returns the numbers of
    the trials enqueued again."""
    watch = watch if watch is not None else HeartbeatWatch()
    watch.new_round()
    study = gateway.study
    _settle_endings(gateway, me, watch, max_retries)
    retried = _queue_retries_due(gateway, watch)
    with gateway.lock:
        # the trials first, then the heartbeats: a sweep beats before it takes a trial, so the owner of any trial
        # read here has beaten by the time its heartbeat is read (the other order could read no beat yet)
        running = gateway.unfinished_store().get_all_trials(
            study._study_id, deepcopy=False, states=(TrialState.RUNNING,)
        )
        study_attrs = study.user_attrs
    for trial in running:
        reason = why_orphaned(trial, me, study_attrs, watch)
        if reason is None:
            continue
        again = may_run_again(trial, max_retries)
        watch.ending[trial.number] = trial  # (until the move's answer comes: a lost one is settled next round)
        if _end_orphan(gateway, trial, reason, again=again, by=me) and again:
            watch.retries_due[trial.number] = trial
        del watch.ending[trial.number]  # (False: another sweep ended it first, and runs it again if it may)
    watch.forget_all_but({trial.number for trial in running})
    return retried + _queue_retries_due(gateway, watch)


def _settle_endings(gateway: StudyGateway, me: Owner, watch: HeartbeatWatch, max_retries: int) -> None:
    """Orphans whose end's answer was lost (the storage failed during the move, which may have committed): one
    this sweep ended (its name is on it) is due for its retry; any other is left to the rounds to come."""
    storage = gateway.study._storage
    for number, trial in list(watch.ending.items()):
        stored = storage.get_trial(trial._trial_id)
        ours = stored.state == TrialState.FAIL and record(stored, "ended_by") == me.sweep
        if ours and may_run_again(trial, max_retries):
            watch.retries_due[number] = trial
        del watch.ending[number]


def _queue_retries_due(gateway: StudyGateway, watch: HeartbeatWatch) -> list[int]:
    """Queue the retries of the orphans this sweep ended; one the storage failed to take stays due, for the next
    round (a FAIL trial is never recovered again, so a retry lost here would be lost for good). A failed enqueue
    may have landed, its answer lost (a database that restarts drops the reply to a commit): it is looked for
    before it is queued again, never queued twice."""
    queued = []
    for number, trial in list(watch.retries_due.items()):
        if number not in watch.retries_tried or not _retry_queued(gateway, number):
            watch.retries_tried.add(number)
            run_again(gateway, trial)
        del watch.retries_due[number]
        watch.retries_tried.discard(number)
        queued.append(number)
    return queued


def _retry_queued(gateway: StudyGateway, number: int) -> bool:
    """Whether the study holds a retry of trial ``number`` (in any state: another sweep may have run it since)."""
    with gateway.lock:
        trials = gateway.study._storage.get_all_trials(gateway.study._study_id, deepcopy=False)
    return any(record(trial, "retry_of") == number for trial in trials)


def why_orphaned(trial: FrozenTrial, me: Owner, study_attrs: dict[str, Any], watch: HeartbeatWatch) -> str | None:
    """Why a RUNNING trial has no live sweep to run it (``study_attrs`` holds the sweeps' heartbeats), or None
    while one may still run it (or no sweep owns or claimed it, or it is ours)."""
    data = record(trial, "owner")
    if data:
        owner = Owner.from_json(data)
        if owner.sweep == me.sweep:
            return None
        gone = owner.gone(study_attrs.get(ATTR + owner.heartbeat_key), watch, judge=me)
        if gone is not None:
            return f"the sweep that ran it died: {gone}"
        sweeps = [owner.sweep]
    else:
        sweeps = claims.claimants(trial)
        if not sweeps:
            return None
    listed = [liveness.listed_trials(study_attrs.get(ATTR + liveness.heartbeat_key(sweep))) for sweep in sweeps]
    unlisted = watch.unlisted_for(trial.number, any(trials is None or trial.number in trials for trials in listed))
    if unlisted < liveness.STALE_AFTER_SECONDS:
        return None
    whose = f"its sweep {sweeps[0]}" if data else f"sweep(s) {sweeps}, which claimed it (no sweep owns it),"
    return f"no live sweep runs it: {whose} has not listed it among its trials for {unlisted:.0f} s"


def may_run_again(trial: FrozenTrial | optuna.Trial, max_retries: int) -> bool:
    """Whether a trial (whose own run was a retry, perhaps) may be run again once more."""
    return int(record(trial, "retries", 0)) < max_retries


def run_again(gateway: StudyGateway, trial: FrozenTrial) -> None:
    """Enqueue ``trial``'s params again, recording which trial it retries and how many runs it had; with its
    checkpoint, if it saved one (the run again resumes from it)."""
    carried = {ATTR + "retry_of": trial.number, ATTR + "retries": int(record(trial, "retries", 0)) + 1}
    saved = record(trial, "checkpoint")
    if saved is not None:
        carried[ATTR + "checkpoint"] = saved
    user, system = split(carried)
    queued = create_trial(
        state=TrialState.WAITING, system_attrs={"fixed_params": trial.params, **system}, user_attrs=user
    )
    with gateway.lock:
        gateway.study.add_trial(queued)  # (study.enqueue_trial, with records: one write)


def _end_orphan(gateway: StudyGateway, trial: FrozenTrial, reason: str, *, again: bool, by: Owner) -> bool:
    """End ``trial`` FAIL with ``reason``; False if it had ended already (another sweep recovering it at once)."""
    note = "; its params run again as a new trial" if again else "; not retried (max_retries reached)"
    attrs = {ATTR + "fail_reason": reason + note, ATTR + "ended_by": by.sweep}
    with gateway.lock:
        # (one write that only one sweep makes, with its reason: two that end one orphan at once queue one retry)
        won = moves.move(
            gateway.study._storage,
            trial._trial_id,
            expected=TrialState.RUNNING,
            to=TrialState.FAIL,
            attrs=attrs,
            signed_by=ATTR + "ended_by",
        )
        gateway.study._thread_local.cached_all_trials = None
    if not won:
        return False
    _logger.warning(f"Trial {trial.number} was left RUNNING: {reason}. It ended FAIL{note}.")
    return True


def take_over(gateway: StudyGateway, me: Owner, *, max_retries: int, watch: HeartbeatWatch | None = None) -> list[int]:
    """What a sweep does on a study it shares, at its start and every :data:`RECOVER_SECONDS`: tell the results
    an earlier sweep kept in the outbox for its trials that its death left RUNNING, then end and run again the
    other orphans. Returns the numbers of the trials enqueued again."""
    watch = watch if watch is not None else HeartbeatWatch()
    watch.new_round()  # (before the outbox's orphans are judged: time this sweep stalled is not their silence)
    study_attrs = gateway.study.user_attrs  # (read once, not per trial)
    gateway.tell_what_the_outbox_kept(lambda trial: why_orphaned(trial, me, study_attrs, watch) is not None)
    return recover_orphans(gateway, me, max_retries=max_retries, watch=watch)


class RecoveryRounds:
    """The rounds of :func:`take_over` a sweep makes: at its start, then every :data:`RECOVER_SECONDS` of
    ``clock``. A storage that fails during a round (an outage of the length the sweep rides out elsewhere) ends the
    round, not the sweep; the next round does the same work again, since every step of it reads the trials anew."""

    def __init__(self, gateway: StudyGateway, me: Owner, *, max_retries: int, clock: Callable[[], float]) -> None:
        self._gateway, self._me, self._max_retries, self._clock = gateway, me, max_retries, clock
        self._next = float("-inf")
        self._watch = HeartbeatWatch()  # (on the machine's clock: other sweeps' heartbeats change in real time)

    def due(self) -> list[int]:
        """The round, if one is due: the numbers of the trials enqueued again."""
        if self._clock() < self._next:
            return []
        self._next = self._clock() + RECOVER_SECONDS
        return recovery_round(self._gateway, self._me, max_retries=self._max_retries, watch=self._watch)


def recovery_round(gateway: StudyGateway, me: Owner, *, max_retries: int, watch: HeartbeatWatch) -> list[int]:
    """One round of :func:`take_over`: a storage that fails during it ends the round, not the sweep."""
    try:
        return take_over(gateway, me, max_retries=max_retries, watch=watch)
    except STORAGE_ERRORS as exc:
        cause = exc.__cause__ or exc
        _logger.warning(
            f"Recovery could not reach the storage ({type(cause).__name__}: {str(cause).splitlines()[0]}); the "
            f"sweep goes on, and the next round tries again in {RECOVER_SECONDS:.0f} s."
        )
        return []
