"""This machine's devices as a pool kind (``runner="local"``, the default): warm workers forked on this machine,
and a launcher per job for strategies whose launcher must own the trial's processes."""

from __future__ import annotations

import os
from collections.abc import Sequence

from optuna_saturn.devices import DeviceSpec, largest_trial, resolve_devices
from optuna_saturn.pools.kinds import BackendOptions, Placement
from optuna_saturn.pools.warm import WorkerPool
from optuna_saturn.pools.warm_backend import WarmBackend
from optuna_saturn.strategy import Strategy


class LocalPool:
    """Trials run on this machine's devices (GPUs, or CPU devices), leased for the sweep (two sweeps on one machine
    take turns)."""

    name = "local"

    def place(self, devices: DeviceSpec, *, allow_shared_cores: bool) -> Placement:
        found = resolve_devices(devices, allow_shared_cores=allow_shared_cores)
        return Placement(found, largest_trial(found))

    def runnable(self, strategies: list[Strategy], asked: Sequence[str] | None) -> list[Strategy]:
        return strategies

    def elastic(self, wanted: bool, *, checkpoint_dir: str | os.PathLike | None, isolate_network: bool) -> bool:
        return wanted

    def warm_backend(self, placement: Placement, options: BackendOptions) -> WarmBackend:
        return WorkerPool(
            placement.devices,
            isolate_network=options.isolate_network,
            one_process=any(s.one_process for s in options.strategies),
            deepspeed_configs=[dict(s.launcher_config) for s in options.strategies if s.engine_traits.builds_ops],
            **options.common(placement.largest_trial),
        )

    def __repr__(self) -> str:
        return "LocalPool()"
