"""How the policies' decisions are carried out: one small handler per kind of decision, reached through
:meth:`Effects.carry_out`. The effects decide nothing; with the loop, they are the only code that talks to the
pool and the study. ``intake`` takes trials in, ``prices`` prices them and teaches the prices, ``starts`` places
work, ``moves`` moves trials and devices, ``ends`` ends trials in the study."""

from __future__ import annotations

from functools import partial
from typing import Any

from optuna_saturn.sweep.effects import ends, intake, moves, prices, starts
from optuna_saturn.sweep.effects.world import World

__all__ = ["Effects", "World"]


class Effects:
    def __init__(self, world: World) -> None:
        self.world = world
        self._handlers = {
            kind: partial(handler, world)
            for module in (intake, prices, starts, moves, ends)
            for kind, handler in module.HANDLERS.items()
        }

    def carry_out(self, decision: Any) -> Any:
        """Do what ``decision`` says; what it returns is the handler's (a price, the trial as told, ...)."""
        return self._handlers[type(decision)](decision)
