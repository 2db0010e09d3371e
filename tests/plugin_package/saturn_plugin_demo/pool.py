"""A pool kind written against optuna-saturn's PoolKind protocol alone: trials run on the first of the machine's
devices, by the machine's own warm workers."""

from optuna_saturn.devices import resolve_devices
from optuna_saturn.pools.kinds import Placement
from optuna_saturn.pools.warm import WorkerPool


class FirstDevice:
    name = "first-device"

    def place(self, devices, *, allow_shared_cores):
        return Placement(resolve_devices(devices, allow_shared_cores=allow_shared_cores)[:1], 1)

    def runnable(self, strategies, asked):
        return strategies

    def elastic(self, wanted, *, checkpoint_dir, isolate_network):
        return False

    def warm_backend(self, placement, options):
        return WorkerPool(placement.devices, isolate_network=options.isolate_network, **options.common(1))
