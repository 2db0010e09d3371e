"""The steps of a trial's training loops (``trial.steps(n)``): counted and reported to the executor in a real run;
in a profiling run, a few timed steps of the first loop, then its later loops counted.

A profiling job runs the user's objective under a strategy to time it (:mod:`optuna_saturn.worker.rank`): its
steps come from :func:`profiled_steps`, a real run's from :class:`LoopProgress`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import DataLoader

from optuna_saturn.training.sharding import LoaderView, max_over_ranks

#: A real run reports its progress at most this often (and at each loop's first and last step).
PROGRESS_EVERY_SECONDS = 2.0
#: A profiling run counts the objective's later loops (epochs) one step each; past this many it stops counting.
_MAX_PROFILED_LOOPS = 10_000
#: While a profiling run counts later loops, a prepared DataLoader yields at most this many batches per pass, so
#: per-epoch evaluations do not run in full every epoch.
_FAST_FORWARD_BATCHES = 2


class ProfileComplete(BaseException):
    """Ends a profiling run whose objective keeps starting ``trial.steps`` loops (more than a profile counts). A
    BaseException, so the objective's own ``except Exception`` does not swallow it."""


@dataclass
class StepTimings:
    """What a profiling run measured of the training loops.

    The first ``trial.steps(n)`` loop runs warm-up and timed steps, then ends early. If the objective then starts
    more loops (``for epoch in range(E): for s in trial.steps(len(loader))``), each runs one real step (so code
    that averages over an epoch still works) and is counted: ``loop_steps`` holds every loop's ``n``. The code
    between the first two loops (a per-epoch evaluation, say) runs in full and is timed as ``between_seconds``;
    after that, prepared DataLoaders yield only a few batches per pass, to get through the remaining epochs
    quickly. The rest of the objective after the last loop is timed by the worker."""

    first_step_at: float
    step_seconds: list[float]
    loop_ended_at: float  # the first loop's early end
    loop_steps: list[int] = field(default_factory=list)
    between_seconds: float | None = None
    last_loop_ended_at: float = 0.0

    @property
    def fast_forward(self) -> bool:
        """Later loops are being counted: the objective runs past them as quickly as it can."""
        return len(self.loop_steps) > 1

    def to_json(self) -> dict:
        return {
            "first_step_at": self.first_step_at,
            "loop_steps": self.loop_steps,
            "between_seconds": self.between_seconds,
            "step_spread": _spread(self.step_seconds),
        }


class ProfilingLoader(LoaderView):
    """A prepared DataLoader in a profiling run: itself until the run starts counting later loops, then at most a
    few batches per pass."""

    def __init__(self, loader: DataLoader, timings: Callable[[], StepTimings | None]) -> None:
        super().__init__(loader)
        self._timings = timings  # the run's timings as they stand when a pass begins

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # torch types it as a private iterator
        batches = iter(self.loader)
        timings = self._timings()
        if timings is None or not timings.fast_forward:
            return batches
        return (batch for _, batch in zip(range(_FAST_FORWARD_BATCHES), batches))


@dataclass(frozen=True)
class ProfiledRanks:
    """What the timed loop needs of the trial's ranks: how many steps to warm up and to time, a barrier that makes
    a step's time its device's, and the control group over which the ranks agree to time again."""

    warmup: int
    timed: int
    synchronize: Callable[[], None]
    group: Any
    world_size: int


def profiled_steps(ranks: ProfiledRanks, timings: StepTimings | None, total: int) -> Generator[int, None, StepTimings]:
    """A loop of a profiling run; returns the run's timings when it ends. The first loop runs warm-up steps, then
    timed ones (synchronised, so a step's time is its device's). Timed steps that differ by more than
    :data:`RETIME_SPREAD` (slowest over fastest) were not settled yet (ZeRO-3 records its prefetch trace,
    ``cudnn.benchmark`` tunes, DDP rebuilds its buckets): they are timed once more, and the second set kept.
    Later loops (``timings`` given) are counted."""
    if timings is not None:
        yield from _counted_loop(timings, total)
        return timings
    warmup, timed = ranks.warmup, ranks.timed
    budget = min(total, warmup + timed)
    first_step_at = time.time()
    durations: list[float] = []
    ranks.synchronize()
    step = 0
    while step < budget:
        began = time.perf_counter()
        yield step
        ranks.synchronize()
        if step >= warmup:
            durations.append(time.perf_counter() - began)
        step += 1
        if step == budget == warmup + timed and total > budget and _spread_over_ranks(ranks, durations) > RETIME_SPREAD:
            budget, durations = min(total, warmup + 2 * timed), []
    ended = time.time()
    return StepTimings(first_step_at, durations, ended, [total], None, ended)


#: Timed steps whose slowest is more than this times their fastest are timed again (once).
RETIME_SPREAD = 1.2


def _spread_over_ranks(ranks: ProfiledRanks, durations: list[float]) -> float:
    """The largest spread of any rank's timed steps: every rank re-times, or none does (one rank alone in its
    next step's gradient all-reduce while the others have left the loop is a collective mismatch)."""
    return max_over_ranks(_spread(durations), group=ranks.group, world_size=ranks.world_size)


def _spread(durations: list[float]) -> float:
    return max(durations) / min(durations) if len(durations) > 1 and min(durations) > 0 else 1.0


def _counted_loop(timings: StepTimings, total: int) -> Iterator[int]:
    """A later loop of a profiling run (the next epoch): count it, run one real step."""
    if len(timings.loop_steps) >= _MAX_PROFILED_LOOPS:
        raise ProfileComplete
    if timings.between_seconds is None:
        timings.between_seconds = time.time() - timings.loop_ended_at
    timings.loop_steps.append(total)
    if total > 0:
        yield 0
    timings.last_loop_ended_at = time.time()


@dataclass
class LoopProgress:
    """A real run's progress over its loops (epochs, when the objective loops per epoch): each loop's steps are
    counted and reported, synchronised, to the executor, which shows them and learns the trial's runtime."""

    report: Callable[..., None]
    synchronize: Callable[[], None]
    loops: int = 0
    steps_done: int = 0  # steps of the loops that ended
    first_loop_started: float | None = None

    def loop(self, start: int, budget: int) -> Iterator[int]:
        loop, done = self.loops, self.steps_done
        self.loops += 1
        started = last_report = time.perf_counter()
        if self.first_loop_started is None:
            self.first_loop_started = started
        taken = start
        try:
            for step in range(start, budget):
                yield step
                taken = step + 1
                now = time.perf_counter()
                if step == start or now - last_report >= PROGRESS_EVERY_SECONDS or step == budget - 1:
                    self.synchronize()
                    now = time.perf_counter()
                    self.report(
                        "progress",
                        step=done + taken,
                        total=done + budget,
                        loop=loop,
                        loop_total=budget,
                        elapsed=now - self.first_loop_started,
                        resumed=start,
                    )
                    last_report = now
        finally:
            self.steps_done = done + taken
