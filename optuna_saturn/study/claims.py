"""Taking a trial out of the study's queue, so that a storage reply lost on the way never has two sweeps run it,
nor leaves it RUNNING with no one to run it for ever.

A take is three writes, none of which can be joined into one through Optuna's storage API:

1. a claim on the WAITING trial: ``saturn:claim:<sweep>``, a nonce, under a key of the sweep's own (two sweeps
   that claim one trial at once never overwrite each other's claim);
2. the move to RUNNING, which the storage lets one process make (``set_trial_state_values`` answers False to
   the others);
3. the owner (``saturn:owner``), written by the gateway.

The storage's move is atomic on PostgreSQL and MySQL (``SELECT ... FOR UPDATE``), in memory and in a journal, but
not on SQLite, which ignores ``FOR UPDATE``: Python's sqlite3 reads outside a transaction, so two processes can
both read WAITING and both move the trial (measured: two sweeps racing for 20 queued trials both took one). On a
SQLite file the move is therefore made under an exclusive ``flock`` on ``<file>.saturn-take.lock`` beside it,
which every optuna-saturn sweep on that file takes.

When a write's reply is lost (the storage raised, but may have committed), the retry reads the trial back: a
WAITING trial is claimed again; a RUNNING one is ours if it names us its owner, or if ours is its only claim
(whoever moved it claimed it first). With several claims and no owner, no reading can tell whose move it was:
the sweep steps back and says so. Such a trial, RUNNING and owned by no one, is listed by no sweep's heartbeat,
and any live sweep's recovery ends it and queues it again once the stale period has passed
(:mod:`optuna_saturn.study.ownership`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass

import optuna
import sqlalchemy
from optuna.storages import BaseStorage, RDBStorage
from optuna.trial import FrozenTrial, TrialState

ATTR = "saturn:"
CLAIM_PREFIX = ATTR + "claim:"
_logger = optuna.logging.get_logger("optuna.saturn")


@dataclass(frozen=True)
class Claimant:
    """A sweep taking a trial, with a nonce of this take's own."""

    sweep: str
    nonce: str

    @property
    def key(self) -> str:
        return CLAIM_PREFIX + self.sweep


def claimants(trial: FrozenTrial) -> list[str]:
    """The sweeps that claimed ``trial`` when it was queued."""
    return [key[len(CLAIM_PREFIX) :] for key in trial.user_attrs if key.startswith(CLAIM_PREFIX)]


def take(storage: BaseStorage, trial_id: int, claimant: Claimant | None, *, retried: bool) -> bool:
    """Move queued trial ``trial_id`` to RUNNING for ``claimant`` (None: a sweep that owns nothing, which does not
    claim); False if another process has it. ``retried``: an earlier attempt raised, and its writes may have
    reached the storage."""
    stored = storage.get_trial(trial_id)
    if stored.state == TrialState.RUNNING and retried and claimant is not None:
        return _ours(stored, claimant)
    if stored.state != TrialState.WAITING:
        return False
    if claimant is not None:
        storage.set_trial_user_attr(trial_id, claimant.key, claimant.nonce)
    with _moves_serialised(storage):
        try:
            return storage.set_trial_state_values(trial_id, TrialState.RUNNING)
        except optuna.exceptions.UpdateFinishedTrialError:
            return False


@contextlib.contextmanager
def _moves_serialised(storage: BaseStorage) -> Iterator[None]:
    """On a SQLite file, one move at a time among all processes and threads (see the module's docstring)."""
    rdb = getattr(storage, "_backend", storage)  # (Optuna wraps an RDB storage in a cache)
    path = None
    if isinstance(rdb, RDBStorage) and rdb.url.startswith("sqlite"):
        path = sqlalchemy.engine.make_url(rdb.url).database
    if not path or path == ":memory:":
        yield
        return
    descriptor = os.open(f"{path}.saturn-take.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # (which releases the lock)


def _ours(stored: FrozenTrial, claimant: Claimant) -> bool:
    """Whether a trial found RUNNING after a lost reply was moved by ``claimant``."""
    owner = stored.user_attrs.get(ATTR + "owner")
    if owner is not None:
        return owner.get("sweep") == claimant.sweep
    if stored.user_attrs.get(claimant.key) != claimant.nonce:
        return False  # (our claim never reached the storage: we never moved it)
    others = [sweep for sweep in claimants(stored) if sweep != claimant.sweep]
    if not others:
        return True
    _logger.warning(
        f"Trial {stored.number} is RUNNING, but a lost storage reply leaves it unclear whether this sweep "
        f"({claimant.sweep}) or sweep(s) {others}, which claimed it too, moved it. This sweep leaves it: if no sweep "
        "runs it, it is ended and queued again once no live sweep's heartbeat has listed it for a minute."
    )
    return False


def refuse_lost_guarantees(storage: BaseStorage) -> None:
    """A storage whose guarantees the sweep relies on are lost, refused before anything runs: an in-memory SQLite
    URL gives each thread its own empty database (the heartbeat's, the workers' requests'), so the sweep could
    not even record a report (reliability review, finding 12)."""
    rdb = getattr(storage, "_backend", storage)
    if isinstance(rdb, RDBStorage) and rdb.url.startswith("sqlite"):
        database = sqlalchemy.engine.make_url(rdb.url).database
        if not database or database == ":memory:":
            raise ValueError(
                f"The study's storage {rdb.url!r} is an in-memory SQLite database, which each thread of the sweep "
                "sees empty. Use a file (sqlite:///sweep.sqlite3), or Optuna's in-memory storage "
                "(optuna.create_study() without a storage)."
            )
