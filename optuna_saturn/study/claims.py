"""Taking a trial out of the study's queue, so that a storage reply lost on the way never has two sweeps run it,
nor leaves it RUNNING with no one to run it for ever.

A take is three writes, none of which can be joined into one through Optuna's storage API:

1. a claim on the WAITING trial: ``saturn:claim:<sweep>``, a nonce, under a key of the sweep's own (two sweeps
   that claim one trial at once never overwrite each other's claim);
2. the move to RUNNING, which only one process can make (:func:`optuna_saturn.study.moves.move`: one
   conditional write, whose row count tells who made it);
3. the owner (``saturn:owner``), written by the gateway.

When a write's reply is lost (the storage raised, but may have committed), the retry reads the trial back: a
WAITING trial is claimed again; a RUNNING one is ours if it names us its owner, or if ours is its only claim
(whoever moved it claimed it first). With several claims and no owner, no reading can tell whose move it was:
the sweep steps back and says so. Such a trial, RUNNING and owned by no one, is listed by no sweep's heartbeat,
and any live sweep's recovery ends it and queues it again once the stale period has passed
(:mod:`optuna_saturn.study.ownership`).
"""

from __future__ import annotations

from dataclasses import dataclass

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from optuna_saturn.study import moves
from optuna_saturn.study.records import ATTR, record, records

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
    prefix = CLAIM_PREFIX[len(ATTR) :]
    return [key[len(prefix) :] for key in records(trial) if key.startswith(prefix)]


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
        storage.set_trial_system_attr(trial_id, claimant.key, claimant.nonce)
    return moves.move(storage, trial_id, expected=TrialState.WAITING, to=TrialState.RUNNING)


def _ours(stored: FrozenTrial, claimant: Claimant) -> bool:
    """Whether a trial found RUNNING after a lost reply was moved by ``claimant``."""
    owner = record(stored, "owner")
    if owner is not None:
        ours: bool = owner.get("sweep") == claimant.sweep  # (the owner is a JSON object: sweep, ...)
        return ours
    if record(stored, claimant.key[len(ATTR) :]) != claimant.nonce:
        return False  # (our claim never reached the storage: we never moved it)
    others = [sweep for sweep in claimants(stored) if sweep != claimant.sweep]
    if not others:
        return True
    _logger.warning(
        f"Trial {stored.number} is RUNNING, but a lost storage reply leaves it unclear whether this sweep "
        f"({claimant.sweep}) or sweep(s) {others}, which claimed it too, moved it. This sweep leaves it: if no sweep "
        "runs it, it is ended and queued again once no live sweep's heartbeat has listed it for 150 s."
    )
    return False
