"""Effects that move trials and devices: a run stopped or asked to move, a trial waiting again (moved, or its
option left out), places lost with their devices, nodes that joined or died, idle devices given back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import optuna

from optuna_saturn.devices import Device
from optuna_saturn.events import TrialMove
from optuna_saturn.sweep import reporting
from optuna_saturn.sweep.decisions import Moved, Readmit, Release, RequestMove, Stop, Unplan
from optuna_saturn.sweep.effects.repricing import price
from optuna_saturn.sweep.effects.world import World

_logger = optuna.logging.get_logger("optuna.saturn")


def stop(world: World, stop: Stop) -> None:
    stop.run.stalled = stop.reason
    _logger.warning(f"Trial {stop.run.number}: {stop.reason}; stopping it.")
    world.pool.stop(stop.run.key, stop.reason)


def request_move(world: World, move: RequestMove) -> None:
    move.run.session.move_requested = True
    left = move.run.assignment.option.label
    world.events.send(
        "on_trial_move", TrialMove(move.run.number, left, move.target.label, "asked", summary=move.summary)
    )


def moved(world: World, moved: Moved) -> None:
    """The trial waits again, to resume from its checkpoint under an option other than the one it left, and
    stays RUNNING in the study meanwhile."""
    run, session = moved.run, moved.run.session
    left = run.assignment.option
    world.resumes.from_run(run, moved=True)
    priced = price(world, session.trial, leaving=left.choice)
    world.gateway.set_attrs(session.trial, {"moves": moved.moves})
    world.state.admit(
        replace(run.waiting, trial=session.trial, price=priced, assignment=None, moves=moved.moves, left=left.choice)
    )
    step = moved.moves[-1]["at_step"]
    world.events.send("on_trial_move", TrialMove(run.number, left.label, "", "stopped", step=step))


def readmit(world: World, readmit: Readmit) -> None:
    _logger.warning(f"Trial {readmit.waiting.number} {readmit.reason}; it is planned again.")
    world.state.admit(readmit.waiting)


def unplan(world: World, unplan: Unplan) -> None:
    world.state.unplan(unplan.numbers)


def release(world: World, release: Release) -> None:
    given = world.pool.release(set(release.devices))
    if given:
        world.state.release(given, world.now())
        names = ", ".join(str(world.state.devices[d]) for d in sorted(given))
        _logger.info(f"Gave {len(given)} idle device(s) back to the cluster ({names}): no trial left needs them.")


def nodes(world: World, joined: list[Device], lost: set[int]) -> set[int]:
    """Nodes joined (their devices are planned on from now) or died (no longer counted on); returns the devices
    newly lost."""
    state = world.state
    if not joined and lost <= state.lost:
        return set()
    newly_lost = lost - state.lost
    state.nodes_seen({d.node: world.pool.node_of(d) for d in joined})
    if not state.nodes_changed([*state.devices, *joined], state.lost | lost, world.now()):
        return set()  # nothing left to plan on: the pool says so (PoolBroken) and the sweep ends
    if newly_lost:
        _logger.warning(reporting.devices_lost(newly_lost, state))
    return newly_lost


#: The decisions this module carries out, and how.
HANDLERS: dict[type, Callable[..., Any]] = {
    Stop: stop,
    RequestMove: request_move,
    Moved: moved,
    Readmit: readmit,
    Unplan: unplan,
    Release: release,
}
