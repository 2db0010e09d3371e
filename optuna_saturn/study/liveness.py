"""Whether the sweeps on a study still live, told by their heartbeats as the reading sweep sees them change.

Each sweep writes a heartbeat to a study attribute of its own (``saturn:heartbeat:<sweep>``) every
:data:`HEARTBEAT_SECONDS`, from a thread, so long plans do not delay it. A beat is ``{"beat": <count>, "at": <the
writer's time>, "trials": [<the numbers of the RUNNING trials it holds>]}``; a sweep that ends sets its key to
``null`` (Optuna's storages have no call that removes a study attribute).

Why a beat is judged by whether it *changes*, on the reader's own clock, and not by its time: two machines' clocks
may differ by more than the stale period, and then a live sweep's fresh beat looks a minute old (or a dead one's
looks fresh). So :class:`HeartbeatWatch` notes when it first saw each beat, and a sweep is silent once its beat
has not changed for :data:`STALE_AFTER_SECONDS` of the reader's time. The list of trials catches what no owner
record can: a trial whose take was cut short (it is RUNNING, claimed, but no sweep owns or runs it) is one that
no live claimant lists.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import optuna

from optuna_saturn.study.gateway import StudyGateway
from optuna_saturn.study.handles import close_handle, own_handle, set_study_attr
from optuna_saturn.study.outbox import retrying
from optuna_saturn.study.records import ATTR, record

_logger = optuna.logging.get_logger("optuna.saturn")

#: How often a sweep writes its heartbeat.
HEARTBEAT_SECONDS = 5.0
#: A sweep whose heartbeat has not changed for this long (on the reader's clock) is gone, and a RUNNING trial
#: that no live sweep listed for this long is no one's. Longer than a storage call is retried for
#: (:data:`~optuna_saturn.study.outbox.RETRY_SECONDS`, 120 s) plus a beat: a sweep that is still riding out an
#: outage of its storage is not yet taken for dead by the sweeps that reach it.
STALE_AFTER_SECONDS = 150.0
#: A judge that did not look for longer than this (its own process stopped, its storage down, its loop busy)
#: does not count the time it missed as others' silence: twice the time between two recoveries.
JUDGE_STALL_SECONDS = 60.0
#: The sweeps running in this process now. A sweep that ended here (say, stopped by a storage that stayed down)
#: is gone although its pid still lives: the next ``optimize`` in the same session must recover its trials.
RUNNING_HERE: set[str] = set()


def heartbeat_key(sweep: str) -> str:
    """The study attribute (without ``saturn:``) that sweep ``sweep`` beats in."""
    return f"heartbeat:{sweep}"


def listed_trials(beat: Any) -> set[int] | None:
    """The trials a heartbeat lists: none for a null beat (its sweep ended, or never beat); None for a beat of
    the old format, which lists no trials at all (so it may hold any)."""
    if beat is None:
        return set()
    if isinstance(beat, dict) and isinstance(beat.get("trials"), list):
        return {int(number) for number in beat["trials"]}
    return None


class HeartbeatWatch:
    """What one sweep has seen of the study's heartbeats and RUNNING trials, timed on its own clock
    (``clock``: monotonic seconds), from one recovery to the next."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._beats: dict[str, tuple[Any, float]] = {}  # heartbeat key -> (its value, when it was first seen)
        self._unlisted: dict[int, float] = {}  # trial number -> since when no live sweep listed it
        self._last_round: float | None = None
        #: orphans this sweep ended whose retry is not yet queued (a storage that failed between the two): the
        #: next round queues them
        self.retries_due: dict[int, Any] = {}
        #: of those, the ones whose enqueue was tried and raised: it may have landed (an answer lost), so it is
        #: looked for before it is queued again
        self.retries_tried: set[int] = set()
        #: orphans this sweep is ending: one whose move's answer was lost is settled at the next round
        self.ending: dict[int, Any] = {}

    def new_round(self) -> None:
        """A recovery starts: time this judge could not observe (it stalled for longer than
        :data:`JUDGE_STALL_SECONDS`) is taken out of every silence it counts."""
        now = self._clock()
        if self._last_round is not None and now - self._last_round > JUDGE_STALL_SECONDS:
            missed = now - self._last_round
            self._beats = {key: (beat, seen + missed) for key, (beat, seen) in self._beats.items()}
            self._unlisted = {number: since + missed for number, since in self._unlisted.items()}
        self._last_round = now

    def silent_for(self, key: str, beat: Any) -> float:
        """For how long ``key``'s beat has been ``beat``, as far as this watch saw (0 the first time)."""
        now = self._clock()
        seen = self._beats.get(key)
        if seen is None or seen[0] != beat:
            self._beats[key] = (beat, now)
            return 0.0
        return now - seen[1]

    def unlisted_for(self, number: int, listed: bool) -> float:
        """For how long no live sweep's heartbeat has listed RUNNING trial ``number`` (0 while one does)."""
        if listed:
            self._unlisted.pop(number, None)
            return 0.0
        return self._clock() - self._unlisted.setdefault(number, self._clock())

    def forget_all_but(self, running: set[int]) -> None:
        """Trials that ended are no longer watched."""
        for number in set(self._unlisted) - running:
            del self._unlisted[number]


class Heartbeat:
    """Writes a sweep's heartbeat to the study every :data:`HEARTBEAT_SECONDS` while in a ``with`` block, listing
    the trials the gateway holds; on leaving, sets its key to null (the sweep has ended). The sweep counts as
    running in this process (:data:`RUNNING_HERE`) meanwhile.

    The beat goes through a storage handle of its own and never takes the study's lock: a sampler that thinks for
    a minute under that lock, or a long write, must not make the others take this sweep for dead."""

    def __init__(self, gateway: StudyGateway, sweep: str) -> None:
        self._gateway = gateway
        self._sweep = sweep
        self._key = ATTR + heartbeat_key(sweep)
        self._count = 0
        self._storage = own_handle(gateway.study._storage)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="saturn-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        RUNNING_HERE.add(self._sweep)
        retrying(self._write, what="write the sweep's first heartbeat")
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        RUNNING_HERE.discard(self._sweep)
        self._stop.set()
        self._thread.join()
        try:  # (one try: a sweep stopping because its storage is down must not wait for it again)
            set_study_attr(self._storage, self._gateway.study, self._key, None)
        except Exception:  # a storage that is down: the others take the silent beat for an end, 150 s later
            _logger.warning("Could not record the sweep's end in its heartbeat.", exc_info=True)
        finally:
            close_handle(self._storage, self._gateway.study._storage)

    def _write(self) -> None:
        self._count += 1
        held = self._gateway.held_trials()
        beat = {"beat": self._count, "at": round(time.time(), 3), "trials": sorted(held)}
        set_study_attr(self._storage, self._gateway.study, self._key, beat)
        self._look_for_takeovers(held)

    def _look_for_takeovers(self, held: dict[int, int]) -> None:
        """Held trials that another sweep ended (it took this one for dead: a pause, a lost connection) are
        noted, so that their runs stop at once and free their devices; otherwise they would run on until they
        tell, and their checkpoints race the other sweep's retry."""
        for number, trial_id in held.items():
            stored = self._storage.get_trial(trial_id)
            ended_by = record(stored, "ended_by")
            if stored.state.is_finished() and ended_by is not None and ended_by != self._sweep:
                self._gateway.note_taken_over(number)

    def _beat(self) -> None:
        failing = False
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self._write()
            except Exception as exc:  # a storage hiccup: the next beat tries again; 150 s of them make us stale
                cause = exc.__cause__ or exc  # (Optuna's wrapper says "invalid data"; the database says why)
                _logger.warning(
                    f"Could not write the sweep's heartbeat ({type(cause).__name__}: {str(cause).splitlines()[0]}); "
                    "trying again every 5 s.",
                    exc_info=not failing,  # (the traceback once per outage, not twelve a minute)
                )
                failing = True
            else:
                failing = False
