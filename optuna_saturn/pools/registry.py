"""The pool kinds by the names ``runner=`` and the CLI's ``--runner`` give them: a new kind adds its line here."""

from __future__ import annotations

from typing import Any

from optuna_saturn.pools.kinds import PoolKind
from optuna_saturn.pools.local_kind import LocalPool
from optuna_saturn.pools.ray_kind import RayPool

#: The pool kinds ``runner=`` names.
KINDS: dict[str, Any] = {"local": LocalPool, "ray": RayPool}


def pool_kind(pool: PoolKind | None, runner: str, *, ray_address: str | None = None) -> PoolKind:
    """The pool the executor was given: ``pool``, or the one ``runner`` (and ``ray_address``) name."""
    if pool is not None:
        if not isinstance(pool, PoolKind):
            raise TypeError(
                f"pool= takes a pool object such as optuna_saturn.pools.LocalPool() or RayPool(address=...), got "
                f"{type(pool).__name__}."
            )
        if runner != "local" or ray_address is not None:
            raise ValueError("Pass either pool= or runner= (and ray_address=), not both: pool= says it all.")
        return pool
    if runner not in KINDS:
        raise ValueError(f"runner must be one of {sorted(KINDS)}, got {runner!r}.")
    if ray_address is not None and runner != "ray":
        raise ValueError("ray_address is for runner='ray'; pass runner='ray' too.")
    kind: PoolKind = KINDS[runner](**({"address": ray_address} if runner == "ray" else {}))
    return kind
