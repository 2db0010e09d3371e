"""How the policies' decisions are carried out: one small handler per kind of decision, reached through
:meth:`Effects.carry_out`. The effects decide nothing; with the loop, they are the only code that talks to the
pool and the study. ``intake`` takes trials in, ``repricing`` prices them and teaches the price source what was
measured, ``starts`` places work, ``moves`` moves trials and devices, ``ends`` ends trials in the study.

A new kind of decision (:data:`~optuna_saturn.sweep.decisions.Decision`) gets its handler in one module's
``HANDLERS``; :class:`Effects` refuses to be built while a kind has none, or two."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, get_args

from optuna_saturn.sweep.decisions import Decision
from optuna_saturn.sweep.effects import ends, intake, moves, repricing, starts
from optuna_saturn.sweep.effects.world import World

__all__ = ["Effects", "World", "handlers"]

#: The modules whose ``HANDLERS`` carry decisions out.
MODULES = (intake, repricing, starts, moves, ends)


def handlers() -> dict[type, list[Callable[..., Any]]]:
    """Each kind of decision, and the handlers the effects' modules declare for it (one each, as built)."""
    found: dict[type, list[Callable[..., Any]]] = {kind: [] for kind in get_args(Decision)}
    for module in MODULES:
        for kind, handler in module.HANDLERS.items():
            found.setdefault(kind, []).append(handler)
    return found


class Effects:
    def __init__(self, world: World) -> None:
        self.world = world
        declared = handlers()
        wrong = {kind.__name__: len(found) for kind, found in declared.items() if len(found) != 1}
        if wrong or set(declared) != set(get_args(Decision)):
            raise TypeError(
                f"each kind of decision needs exactly one handler in an effects module's HANDLERS: {wrong} (and "
                "every kind handled must be listed in sweep.decisions.Decision)"
            )
        self._handlers = {kind: partial(found[0], world) for kind, found in declared.items()}

    def carry_out(self, decision: Decision) -> Any:
        """Do what ``decision`` says; what it returns is the handler's (a price, the trial as told, ...), which a
        policy's hook that is a generator gets back from its ``yield``."""
        return self._handlers[type(decision)](decision)
