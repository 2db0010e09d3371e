"""Where a sweep's trials run, as the object ``SaturnExecutor(pool=...)`` takes: this machine's devices
(:class:`~optuna_saturn.pools.local_kind.LocalPool`), a Ray cluster's nodes
(:class:`~optuna_saturn.pools.ray_kind.RayPool`) or a SLURM job's (:class:`~optuna_saturn.pools.slurm_kind.SlurmPool`).
``runner="local"``, ``"ray"`` and ``"slurm"`` are shorthands for them (their default options).

Why instances: a pool kind was a string that five modules outside ``pools/`` branched on (a review counted 6-7
files touched to add one). Now the executor, the real sweep and the CLI ask the kind, and only ``pools/`` knows
which kinds there are. A new kind (Kubernetes, say) implements :class:`PoolKind`, which finds the devices
(:meth:`~PoolKind.place`) and builds the warm workers on them (:meth:`~PoolKind.warm_backend`, a
:class:`~optuna_saturn.pools.warm_backend.WarmBackend`), and adds one line to
:data:`optuna_saturn.pools.registry.BUILT_IN` for its ``runner=`` name.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast, runtime_checkable

from optuna_saturn.devices import Device, DeviceSpec
from optuna_saturn.pools.warm_backend import WarmBackend
from optuna_saturn.strategy import Strategy


@dataclass(frozen=True)
class Placement:
    """The devices a pool kind found, and what the planner and the memory limits need to know of them."""

    devices: Sequence[Device]
    largest_trial: int  # the most devices one trial may take (a node's, on a cluster)
    hardware: str | None = None  # the profile store's fingerprint of a device, measured where it is (None: here)
    device_memory: int | None = None  # bytes one device has, measured where it is (None: measured here)
    leases_here: bool = True  # whether this process leases the devices on this machine (else their workers do)
    machine_memory_limit: bool = True  # whether worker_memory_limit="auto" means this machine's RAM per device
    found: Any = None  # what the kind itself keeps of what it found (a cluster's nodes)


@dataclass(frozen=True)
class BackendOptions:
    """What every warm backend is built with: the sweep's settings a pool kind needs, whatever its kind."""

    strategies: Sequence[Strategy]
    log_dir: Path
    study_name: str
    grace_period: float
    memory_limit: float | None
    collective_timeout: float
    isolate_network: bool

    def common(self, largest: int) -> dict[str, Any]:
        """The keyword arguments both kinds of warm workers take."""
        return dict(
            memory_limit=self.memory_limit,
            collective_timeout=self.collective_timeout,
            log_dir=self.log_dir,
            grace_period=self.grace_period,
            engines={s.engine for s in self.strategies},
            multi_device=any(n > 1 for s in self.strategies for n in s.device_counts(largest)),
        )


@runtime_checkable
class PoolKind(Protocol):
    """A kind of pool: what a new one implements (besides its :class:`WarmBackend`). One whose :meth:`place` takes
    something that must be given back (a SLURM job it asks for) may also have a ``close()``, which the executor
    calls when its construction fails after ``place`` (see :func:`pool_closed_on_error`)."""

    #: how the CLI's ``--runner`` and the logs name it
    name: str

    def place(self, devices: DeviceSpec, *, allow_shared_cores: bool) -> Placement:
        """Find the devices to run on, as ``devices`` asks (on a cluster: per node). Raises with the fix where
        they cannot be found (no cluster to reach, a library missing)."""

    def runnable(self, strategies: list[Strategy], asked: Sequence[str] | None) -> list[Strategy]:
        """Of the ``strategies`` that fit, those this kind's workers can run (``asked``: the names the user gave,
        None for all): one it cannot run that was asked by name is an error naming the fix."""

    def elastic(self, wanted: bool, *, checkpoint_dir: str | os.PathLike | None, isolate_network: bool) -> bool:
        """Whether trials may move between devices mid-run (``wanted``: the user's ``elastic``); raises for an
        option this kind cannot honour."""

    def warm_backend(self, placement: Placement, options: BackendOptions) -> WarmBackend:
        """The warm workers, one per device of ``placement``."""


_Init = TypeVar("_Init", bound=Callable[..., None])


def pool_closed_on_error(init: _Init) -> _Init:
    """An ``__init__`` that, where it raises, first calls ``self.pool.close()`` if the pool kind has one: what its
    ``place`` took (a SLURM job) is not held, idle, until the process ends by an executor that was never made."""

    @functools.wraps(init)
    def init_or_close(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except BaseException:
            close = getattr(getattr(self, "pool", None), "close", None)
            if callable(close):
                close()
            raise

    return cast(_Init, init_or_close)
