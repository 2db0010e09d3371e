"""Who runs a sweep's RUNNING trials, so that the next sweep can tell a trial whose executor died from one that
another live sweep is running, and run the dead one's trials again.

Why not Optuna's heartbeats: ``RetryHeartbeatStaleTrialCallback`` works only inside ``study.optimize`` and with
RDB storage. Here every trial a sweep asks records its owner (``saturn:owner``: the sweep's id, host, pid and the
process's start time, which tells a reused pid apart), and the sweep writes a heartbeat to a study attribute of
its own (``saturn:heartbeat:<sweep>``) every few seconds, from a thread, so long plans do not delay it. Both are
plain user attributes: any persistent storage (RDB, Journal) carries them, and two executors never write the same
key. A trial's owner is gone when its process no longer exists, judged by its pid only where the pid means the
same process (the same host, boot and PID namespace: two containers on one host, or a restarted machine, reuse
pids), or, from anywhere else, when its heartbeat is older than :data:`STALE_AFTER_SECONDS`. Two sweeps that end
the same orphan at once do no harm: only the one whose write ended it runs it again.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import optuna
import psutil
from optuna.trial import FrozenTrial, TrialState

from optuna_saturn.study.gateway import ATTR, StudyGateway

_logger = optuna.logging.get_logger("optuna.saturn")

#: How often a sweep writes its heartbeat.
HEARTBEAT_SECONDS = 5.0
#: A sweep silent for this long is gone (twelve missed heartbeats: a storage that is slow for a while, or an
#: executor busy planning, is not taken for dead).
STALE_AFTER_SECONDS = 60.0
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
        return cls(uuid.uuid4().hex[:12], socket.gethostname(), me.pid, me.create_time(), _boot_id(),
                   _pid_namespace())

    @classmethod
    def from_json(cls, data: dict) -> Owner:
        return cls(str(data["sweep"]), str(data["host"]), int(data["pid"]), float(data["started"]),
                   str(data.get("boot", "")), str(data.get("pid_namespace", "")))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def heartbeat_key(self) -> str:
        return f"heartbeat:{self.sweep}"

    def gone(self, heartbeat: float | None, now: float, *, judge: Owner) -> str | None:
        """Why this owner is gone, as ``judge`` (the sweep that asks, in this process) sees it, or None while it
        may still run its trials."""
        if self.host == judge.host and self.boot and self.boot == judge.boot and \
                self.pid_namespace and self.pid_namespace == judge.pid_namespace:
            try:
                process = psutil.Process(self.pid)
                if process.create_time() == self.started and process.status() != psutil.STATUS_ZOMBIE:
                    return None
            except psutil.NoSuchProcess:
                pass
            return f"its executor (pid {self.pid} on {self.host}) is gone"
        if heartbeat is None or now - heartbeat > STALE_AFTER_SECONDS:
            silent = "never wrote a heartbeat" if heartbeat is None else f"silent for {now - heartbeat:.0f} s"
            return f"its executor (pid {self.pid} on {self.host}) is {silent}"
        return None


class Heartbeat:
    """Writes the owner's heartbeat to the study every :data:`HEARTBEAT_SECONDS`, while in a ``with`` block."""

    def __init__(self, bridge: StudyGateway, owner: Owner) -> None:
        self._bridge = bridge
        self._owner = owner
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="saturn-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._bridge.set_study_attr(self._owner.heartbeat_key, time.time())
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self._bridge.set_study_attr(self._owner.heartbeat_key, time.time())
            except Exception:  # a storage hiccup: the next beat tries again; a minute of them makes us stale
                _logger.warning("Could not write the sweep's heartbeat to the storage; trying again.", exc_info=True)


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def recover_orphans(bridge: StudyGateway, me: Owner, *, max_retries: int) -> list[int]:
    """End every RUNNING trial whose owning sweep is gone as FAIL, with the reason, and enqueue its params again
    (``saturn:retry_of``) unless it was retried ``max_retries`` times already. Trials of live sweeps, and trials no
    sweep owns (a plain ``study.optimize``'s), are left alone. Returns the numbers of the trials enqueued again."""
    study = bridge.study
    now = time.time()
    retried: list[int] = []
    with bridge.lock:
        heartbeats = study.user_attrs
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for trial in running:
        reason = why_orphaned(trial, me, heartbeats, now)
        if reason is None:
            continue
        again = may_run_again(trial, max_retries)
        if not _end_orphan(bridge, trial, f"the sweep that ran it died: {reason}", again=again, by=me):
            continue  # another sweep ended it first, and runs it again if it may
        if again:
            run_again(bridge, trial)
            retried.append(trial.number)
    return retried


def why_orphaned(trial: FrozenTrial, me: Owner, study_attrs: dict[str, Any], now: float) -> str | None:
    """Why a RUNNING trial's sweep is gone (``study_attrs`` holds the sweeps' heartbeats), or None while it may
    still run it (or no sweep owns it, or it is ours)."""
    data = trial.user_attrs.get(ATTR + "owner")
    if not data:
        return None
    owner = Owner.from_json(data)
    return None if owner.sweep == me.sweep else owner.gone(study_attrs.get(ATTR + owner.heartbeat_key), now,
                                                           judge=me)


def may_run_again(trial: FrozenTrial, max_retries: int) -> bool:
    """Whether a trial (whose own run was a retry, perhaps) may be run again once more."""
    return int(trial.user_attrs.get(ATTR + "retries", 0)) < max_retries


def run_again(bridge: StudyGateway, trial: FrozenTrial) -> None:
    """Enqueue ``trial``'s params again, recording which trial it retries and how many runs it had; with its
    checkpoint, if it saved one (the run again resumes from it)."""
    carried = {ATTR + "retry_of": trial.number, ATTR + "retries": int(trial.user_attrs.get(ATTR + "retries", 0)) + 1}
    if ATTR + "checkpoint" in trial.user_attrs:
        carried[ATTR + "checkpoint"] = trial.user_attrs[ATTR + "checkpoint"]
    with bridge.lock:
        bridge.study.enqueue_trial(trial.params, user_attrs=carried)


def _end_orphan(bridge: StudyGateway, trial: FrozenTrial, reason: str, *, again: bool, by: Owner) -> bool:
    """End ``trial`` FAIL with ``reason``; False if it had ended already (another sweep recovering it at once)."""
    note = "; its params run again as a new trial" if again else "; not retried (max_retries reached)"
    with bridge.lock:
        storage = bridge.study._storage
        try:
            storage.set_trial_user_attr(trial._trial_id, ATTR + "fail_reason", reason + note)
            storage.set_trial_user_attr(trial._trial_id, ATTR + "ended_by", by.sweep)
            bridge.study.tell(trial.number, state=TrialState.FAIL)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError):  # ("Cannot tell a FAIL trial")
            return False
    _logger.warning(f"Trial {trial.number} was left RUNNING: {reason}. It ended FAIL{note}.")
    return True


def inherit_intermediate_values(bridge: StudyGateway, trial: optuna.Trial) -> None:
    """A retried trial starts with the intermediate values its first run reported (the pruner sees its curve)."""
    with bridge.lock:
        retry_of = trial.user_attrs.get(ATTR + "retry_of")
        if retry_of is None:
            return
        earlier = bridge.study.get_trials(deepcopy=False)[int(retry_of)]
        for step, value in sorted(earlier.intermediate_values.items()):
            trial.report(value, step)


def take_over(gateway: StudyGateway, me: Owner, *, max_retries: int) -> list[int]:
    """What a sweep does first on a study it shares: tell the results an earlier sweep kept in the outbox for its
    trials that its death left RUNNING, then end and run again the other trials of dead sweeps. Returns the
    numbers of the trials enqueued again."""
    heartbeats, now = gateway.study.user_attrs, time.time()  # (read once, not per trial)
    gateway.tell_what_the_outbox_kept(lambda trial: why_orphaned(trial, me, heartbeats, now) is not None)
    return recover_orphans(gateway, me, max_retries=max_retries)
