"""The real sweep loop at scale, in virtual time: seeded random trials (10 min to 3 h on one device, each with
options from 1 to 8 devices; ``workloads.random_workload``) enqueued and run by the simulator (the real loop, the
real planner with solver "auto", a simulated pool) on nodes of 8 devices. Reports the wall clock, the makespan
against the lower bound, the time the loop takes per event (median and p99 of its rounds that handled an event)
and where that time goes (exclusive time per part, measured by wrapping each part; the wrapping costs a little).

Usage: ``python benchmarks/loop_scaling.py [--cases 1000:64 10000:512] [--tick 60] [--seed 0] [--no-breakdown]``.
``--tick``: the loop's idle wake-ups, in virtual seconds (events are never skipped; trials run for hours)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator

import _common  # noqa: F401
from workloads import markdown_table, random_workload

from optuna_saturn.planner import Cluster, lower_bound
from optuna_saturn.simulation.pool import SimulatedPool
from optuna_saturn.simulation.simulator import simulate
from optuna_saturn.sweep import dispatch, reporting
from optuna_saturn.sweep.asking import Asking
from optuna_saturn.sweep.effects import intake, repricing, starts
from optuna_saturn.sweep.elastic import Elastic
from optuna_saturn.sweep.faults import Faults
from optuna_saturn.sweep.loop import Sweep
from optuna_saturn.sweep.options import OptionsView
from optuna_saturn.sweep.planning import Planning
from optuna_saturn.sweep.profiling import Profiling

#: The parts timed: (what holds it, its attribute, the name in the table).
PARTS = [
    (SimulatedPool, "wait", "pool (simulated)"),
    (Sweep, "_ended", "job ends: telling, learning"),
    (repricing, "reprice", "re-pricing"),
    (Planning, "plan", "planning"),
    (Planning, "due", "planning"),
    (dispatch, "starts", "dispatch"),
    (starts, "start", "starting trials"),
    (Sweep, "_ask", "asking and describing"),
    (intake, "ask", "asking and describing"),
    (Asking, "next", "asking and describing"),
    (OptionsView, "jobs_and_busy", "options view"),
    (Profiling, "measurements", "profiling policy"),
    (Elastic, "move", "elastic policy"),
    (Faults, "stalled", "faults policy"),
    (reporting, "relay_progress", "progress relay"),
]


class ExclusiveTimer:
    """Time spent in each part, not counting the parts it calls."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._stack: list[list] = []

    def wrap(self, name: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            frame = [time.perf_counter(), 0.0]
            self._stack.append(frame)
            try:
                return fn(*args, **kwargs)
            finally:
                self._stack.pop()
                spent = time.perf_counter() - frame[0]
                self.seconds[name] += spent - frame[1]
                if self._stack:
                    self._stack[-1][1] += spent

        return timed


@contextlib.contextmanager
def event_rounds() -> Iterator[list[float]]:
    """The seconds of each loop round that handled an event (a job ended or started, a trial arrived), while in
    the ``with`` block."""
    rounds: list[float] = []
    original = Sweep._step

    def step(self):
        began = time.perf_counter()
        before = self._state.asked, len(self._state.running), len(self._state.waiting)
        result = original(self)
        if (self._state.asked, len(self._state.running), len(self._state.waiting)) != before:
            rounds.append(time.perf_counter() - began)
        return result

    Sweep._step = step
    try:
        yield rounds
    finally:
        Sweep._step = original


def run_case(trials: int, nodes: int, tick: float, seed: int, *, breakdown: bool = True) -> list:
    jobs, cluster = random_workload(trials, seed), Cluster([8] * nodes)
    timer, rounds, saved = ExclusiveTimer(), [], []
    for holder, attribute, name in PARTS if breakdown else ():
        original = getattr(holder, attribute)
        saved.append((holder, attribute, original))
        setattr(holder, attribute, timer.wrap(name, original))
        for kind, handler in getattr(holder, "HANDLERS", {}).items():  # (an effect is reached through its module's)
            if handler is original:
                holder.HANDLERS[kind] = getattr(holder, attribute)
    try:
        with event_rounds() as measured:
            began = time.perf_counter()
            result = simulate(jobs, cluster, mode="replan", solver="auto", tick=tick, seed=seed)
            wall = time.perf_counter() - began
        rounds.extend(measured)
    finally:
        for holder, attribute, original in saved:
            for kind, handler in getattr(holder, "HANDLERS", {}).items():
                if handler is getattr(holder, attribute):
                    holder.HANDLERS[kind] = original
            setattr(holder, attribute, original)
    rounds.sort()
    total = sum(timer.seconds.values()) if breakdown else wall
    shares = ", ".join(
        f"{name} {100 * s / wall:.0f}%"
        for name, s in sorted(timer.seconds.items(), key=lambda kv: -kv[1])
        if s / wall >= 0.02
    )
    return [
        trials,
        8 * nodes,
        f"{wall:.0f}",
        f"{result.makespan / lower_bound(jobs, cluster):.3f}",
        len(rounds),
        f"{1e3 * statistics.median(rounds):.1f}",
        f"{1e3 * rounds[int(0.99 * len(rounds))]:.0f}",
        f"{100 * (wall - total) / wall:.0f}%",
        shares,
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", nargs="*", default=["1000:64", "10000:512"], help="trials:devices")
    parser.add_argument("--tick", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-breakdown",
        action="store_true",
        help="time the loop only (no wrapping of its parts, which costs a little)",
    )
    args = parser.parse_args()
    rows = []
    for case in args.cases:
        trials, devices = (int(x) for x in case.split(":"))
        rows.append(run_case(trials, devices // 8, args.tick, args.seed, breakdown=not args.no_breakdown))
        print(rows[-1], flush=True)
    print(
        markdown_table(
            [
                "trials",
                "devices",
                "wall (s)",
                "makespan / LB",
                "events",
                "per event, median (ms)",
                "p99 (ms)",
                "rest of the loop",
                "where the time goes (of the wall clock)",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
