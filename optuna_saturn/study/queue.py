"""The study's queue (``study.enqueue_trial``): trials known before they run.

A queued trial whose parameters are all fixed is known without asking it: the sweep describes and prices it
from its fixed parameters (:class:`QueuedTrial`), plans it with the other trials, and takes it from the queue only
when it starts it. This is the workload the planner is for (Saturn plans a known set of jobs): a long trial
enqueued last can start first, and the short ones fill the tail, where first come, first served (what
``study.optimize`` does) leaves a device idle at the end. The queue itself is left as it is until then, so a
timeout, ``study.stop()`` or Ctrl-C leaves the trials not started in it, still WAITING, and another sweep on the
same study may take any of them (the first to take one runs it).

A queued trial that suggests a parameter the queue did not fix needs the sampler: describing it stops there
(:class:`ParameterNotFixed`), and it is asked when the look-ahead needs a trial, like a sampled one; the queue's
later trials wait behind it, in their order.
"""

from __future__ import annotations

import collections
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial

from optuna_saturn.clock import Clock
from optuna_saturn.study.gateway import StudyGateway
from optuna_saturn.study.records import ATTR, record

#: How many known trials may wait at once, per device: enough for the planner to order the sweep's tail ...
QUEUED_TRIALS_PER_DEVICE = 4
#: ... and in all: on a large cluster, two waves of trials per device are known well ahead, and each is described
#: in the loop's thread (seconds, for a large model) and planned at every fresh plan.
MOST_QUEUED_TRIALS = 1024
#: How long an empty queue is believed empty (a callback, or another process, may enqueue trials meanwhile).
_RECHECK_SECONDS = 1.0


class ParameterNotFixed(BaseException):
    """A queued trial suggested a parameter the queue did not fix. (A ``BaseException``, like the probe's own
    stop, so that an objective's ``except Exception`` does not take it for its own error.)"""


class QueuedTrial(optuna.trial.FixedTrial):
    """A queued trial as the sweep describes it before taking it: it answers ``suggest_*`` from the parameters
    the queue fixed, and keeps the records the sweep makes (:mod:`optuna_saturn.study.records`), which go to the
    real trial when it is taken."""

    def __init__(self, queued: FrozenTrial) -> None:
        super().__init__(dict(queued.system_attrs.get("fixed_params") or {}), number=queued.number)
        self.trial_id = queued._trial_id
        for key, value in queued.user_attrs.items():
            self.set_user_attr(key, value)
        self.records = {k: v for k, v in queued.system_attrs.items() if k.startswith(ATTR)}

    def _suggest(self, name: str, distribution: BaseDistribution) -> Any:
        if name not in self._params:
            raise ParameterNotFixed(name)
        return super()._suggest(name, distribution)


class StudyQueue:
    """Which of the study's queued trials the sweep has not seen yet, and whether it may still describe them
    before asking them."""

    def __init__(self, gateway: StudyGateway, clock: Clock) -> None:
        self._gateway = gateway
        self._clock = clock
        self._sampling: set[int] = set()  # queued trials whose description needed the sampler
        self._empty_until = 0.0
        self._unread: collections.deque[FrozenTrial] = collections.deque()  # the last look's, not served yet
        self._taken: set[int] = set()  # (the last look may still list them)

    def next_unseen(self, seen: set[int]) -> FrozenTrial | None:
        """The first queued trial whose number is not in ``seen``, if any (the same one until it is seen or
        taken). One look at the study serves the trials it found in turn: reading a queue of thousands for each
        trial would cost more than describing them; one another sweep took meanwhile is found taken when the sweep
        takes it."""
        while self._unread and (self._unread[0].number in seen or self._unread[0].number in self._taken):
            self._unread.popleft()
        if self._unread:
            return self._unread[0]
        if self._clock.now() < self._empty_until:
            return None
        self._unread.extend(t for t in self._gateway.queued() if t.number not in seen)
        if self._unread:
            return self._unread[0]
        self._empty_until = self._clock.now() + _RECHECK_SECONDS
        return None

    def look_again(self) -> None:
        """Trials may have been enqueued just now (a trial run again, or a callback's ``enqueue_trial``): the next
        look reads the queue, even if it was empty a moment ago. Else a new trial would be asked ahead of them, and
        once ``n_trials`` is reached they would be left WAITING."""
        self._empty_until = 0.0
        self._unread.clear()

    def may_describe(self, queued: FrozenTrial) -> bool:
        """Whether ``queued`` may be described before it is asked: it did not need the sampler when it was last
        tried (its objective is not run up to that point again), and it is not a trial run again (whose checkpoint
        decides its options when it is taken)."""
        return queued.number not in self._sampling and record(queued, "retry_of") is None

    def samples(self, number: int, name: str) -> None:
        """Queued trial ``number`` suggested ``name``, which the queue did not fix."""
        self._sampling.add(number)
        optuna.logging.get_logger("optuna.saturn").info(
            f"Trial {number} in the study's queue samples {name!r}: it is asked when a device needs it, like a "
            "sampled one (the sampler then sees as many finished trials as it can); the queue's later trials wait "
            "behind it."
        )

    def take(self, queued: QueuedTrial | FrozenTrial) -> optuna.Trial | None:
        """The queued trial, now RUNNING, with what its description suggested and set; None if another sweep
        took it first."""
        self._taken.add(queued.number)
        if isinstance(queued, QueuedTrial):
            return self._gateway.take(queued.trial_id, queued.distributions, queued.records)
        return self._gateway.take(queued._trial_id, {}, {})
