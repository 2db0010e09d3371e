"""How many devices, for how long: a recorded sweep's trials simulated on growing pools for a deadline or a budget.

"How many GPUs, and how long, to finish by Monday?" is the fewest devices whose simulated sweep, planning for the
deadline, ends by it; "what is the fastest I can get for 100 GPU-hours?" is the pool whose simulated sweep,
planning for the budget, ends first within it. Each answer is the real loop's, on a virtual clock
(:func:`~optuna_saturn.simulation.simulator.run_simulation`), with what the trials really took (``replay``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from optuna_saturn.planner import Cluster, DeadlineUnreachable, Goal, device_seconds
from optuna_saturn.simulation.replay import Replay
from optuna_saturn.simulation.simulator import run_simulation


@dataclass(frozen=True)
class Sizing:
    """One pool tried: its simulated end and device-hours (None: the plan refused the deadline)."""

    devices: int
    wall_seconds: float | None
    device_hours: float | None
    earliest_end: float | None  # where the deadline was refused: the earliest end its plan could reach
    meets: bool
    cost: float | None


def sizes(replay: Replay, goal: Goal, counts: Iterable[int], **simulation: Any) -> list[Sizing]:
    """The sweep of ``replay``'s trials, planned for ``goal``, on one node of each of ``counts`` devices."""
    rows = []
    for count in counts:
        try:
            result = run_simulation(
                replay.jobs,
                Cluster([count]),
                goal=goal,
                known_ahead=replay.known_ahead,
                workers_ready=replay.typical_ready,
                **simulation,
            )
        except DeadlineUnreachable as refused:
            rows.append(Sizing(count, None, None, refused.earliest_end, False, None))
            continue
        wall, spent = result.info["wall_seconds"], device_seconds(result.executed)
        meets = not goal.violation(wall, spent)
        cost = spent / 3600 * goal.price_per_device_hour if goal.price_per_device_hour else None
        rows.append(Sizing(count, wall, spent / 3600, None, meets, cost))
    return rows


def answer(rows: list[Sizing], goal: Goal) -> Sizing | None:
    """Under a deadline, the fewest devices that meet it; under a budget, the earliest end within it."""
    meeting = [r for r in rows if r.meets]
    if not meeting:
        return None
    return min(meeting, key=lambda r: goal.size_key(r.devices, r.wall_seconds or 0.0, r.device_hours or 0.0))
