"""The one list of engines: the package's own, and those other installed distributions declare in the
``optuna_saturn.engines`` entry-point group, each as ``name = "module:TraitsClass"`` (an
:class:`~optuna_saturn.strategy.engine_traits.EngineTraits` subclass, which names its engine class in turn).

Names are read without importing anything; an engine's traits are imported the first time its name is asked for,
and its engine class only inside a worker (:func:`optuna_saturn.engines.engine_class`).
"""

from __future__ import annotations

import functools
import importlib
from importlib.metadata import entry_points

from optuna_saturn.strategy.builtin_engines import BUILTIN_TRAITS
from optuna_saturn.strategy.engine_traits import EngineTraits

ENTRY_POINT_GROUP = "optuna_saturn.engines"
#: The package's own engines, as an entry point would name them.
BUILTIN_ENGINES: dict[str, str] = {name: f"{c.__module__}:{c.__qualname__}" for name, c in BUILTIN_TRAITS.items()}


class EngineError(ValueError):
    """An engine name is unknown, or a registered engine is not declared as the registry needs."""


@functools.cache
def registered() -> dict[str, str]:
    """Each engine's name and where its traits are: the package's own, then the entry points' (read once per
    process: installing a distribution takes effect in the next one)."""
    found = dict(BUILTIN_ENGINES)
    for point in entry_points(group=ENTRY_POINT_GROUP):
        if point.name in BUILTIN_ENGINES:
            raise EngineError(
                f"The entry point {point.name} = {point.value!r} (group {ENTRY_POINT_GROUP!r}) takes the name of "
                "one of optuna-saturn's own engines; give the plug-in's engine a name of its own."
            )
        found[point.name] = point.value
    return found


def engine_names() -> tuple[str, ...]:
    return tuple(registered())


def traits_of(name: str) -> EngineTraits:
    """The traits of the engine called ``name`` (a template's ``engine``)."""
    try:
        where = registered()[name]
    except KeyError:
        raise EngineError(
            f"No engine {name!r}; known engines: {list(registered())}. An engine from another distribution is "
            f"found through its entry point in the group {ENTRY_POINT_GROUP!r} once that distribution is installed."
        ) from None
    return _load(name, where)


@functools.cache
def _load(name: str, where: str) -> EngineTraits:
    module, _, attribute = where.partition(":")
    found = getattr(importlib.import_module(module), attribute, None)
    if not (isinstance(found, type) and issubclass(found, EngineTraits)) or found.engine.count(":") != 1:
        raise EngineError(
            f"The engine {name!r} is registered as {where!r}, which is not an EngineTraits subclass naming its "
            "engine class as engine = 'module:Class' (see optuna_saturn.strategy.engine_traits)."
        )
    return found(name)
