"""The pool kinds by the names ``runner=`` and the CLI's ``--runner`` give them: the built-in ones, and those other
installed distributions declare in the ``optuna_saturn.pools`` entry-point group (``name = "module:Class"``, a
class whose instances, made with no arguments, are :class:`~optuna_saturn.pools.kinds.PoolKind`\\ s). A kind
that takes options is passed as ``pool=`` instead."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

import optuna

from optuna_saturn.pools.kinds import PoolKind
from optuna_saturn.pools.local_kind import LocalPool
from optuna_saturn.pools.ray_kind import RayPool
from optuna_saturn.pools.slurm_kind import SlurmPool

_logger = optuna.logging.get_logger("optuna.saturn")

#: The entry-point group where another distribution declares a pool kind.
ENTRY_POINT_GROUP = "optuna_saturn.pools"
#: The built-in pool kinds ``runner=`` names.
BUILT_IN: dict[str, Any] = {"local": LocalPool, "ray": RayPool, "slurm": SlurmPool}


#: What a pool kind offers (optuna_saturn.pools.kinds.PoolKind), named where one lacks some.
_MEMBERS = ("name", "place", "runnable", "elastic", "warm_backend")


def kinds() -> dict[str, Any]:
    """Every pool kind ``runner=`` may name: the built-in ones, then the installed plug-ins' (an entry point, not
    loaded until it is used; one that reuses a built-in name is left out, with a warning)."""
    found: dict[str, Any] = dict(BUILT_IN)
    for point in entry_points(group=ENTRY_POINT_GROUP):
        if point.name in BUILT_IN:
            _logger.warning(f"The pool kind {point.name!r} of {point.value} is left out: the name is a built-in one.")
            continue
        found[point.name] = point
    return found


def pool_kind(pool: PoolKind | None, runner: str, *, ray_address: str | None = None) -> PoolKind:
    """The pool the executor was given: ``pool``, or the one ``runner`` (and ``ray_address``) name."""
    if pool is not None:
        if isinstance(pool, type):
            raise TypeError(f"pool= takes a pool object, not its class: pass {pool.__name__}().")
        missing = [name for name in _MEMBERS if not hasattr(pool, name)]
        if missing or not isinstance(pool, PoolKind):
            raise TypeError(
                f"pool= takes a pool object such as optuna_saturn.pools.LocalPool() or RayPool(address=...), got "
                f"{type(pool).__name__}, which lacks {missing} of optuna_saturn.pools.PoolKind."
            )
        if runner != "local" or ray_address is not None:
            raise ValueError("Pass either pool= or runner= (and ray_address=), not both: pool= says it all.")
        return pool
    known = kinds()
    if runner not in known:
        raise ValueError(f"runner must be one of {sorted(known)}, got {runner!r}.")
    if ray_address is not None and runner != "ray":
        raise ValueError("ray_address is for runner='ray'; pass runner='ray' too.")
    if runner == "ray":
        return RayPool(address=ray_address)
    kind = known[runner]
    made = (kind.load() if hasattr(kind, "load") else kind)()
    if not isinstance(made, PoolKind):
        raise TypeError(f"The pool kind {runner!r} ({kind}) does not implement optuna_saturn.pools.PoolKind.")
    return made
