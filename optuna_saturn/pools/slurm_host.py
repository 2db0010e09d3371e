"""A SLURM node's pool host, as ``srun`` starts it on its node (:mod:`optuna_saturn.pools.slurm_node`):
``python -m optuna_saturn.pools.slurm_host CONFIG_PATH``, its config on stdin.

It keeps the config at ``CONFIG_PATH`` on its node (the folder is made there if the node does not share it: the
jobs' rendezvous files go there too), with its node's cores and GPU mask, and its own parent as the process it
dies with (the step's ``slurmstepd``, not the executor, which runs elsewhere); takes its node's device leases
(waiting, said in its log, while another sweep on the node holds them); and then is the pool host of
:mod:`optuna_saturn.pools.warm_host`: it forks a warm worker per device, and replaces one that exits. Its leases
live as long as it does.
"""

from __future__ import annotations

import json
import os
import sys

from optuna_saturn.devices import Device, available_cores, physical_gpus, pin_cores
from optuna_saturn.leases import lease_names
from optuna_saturn.pools.ray_lease import ActorLease
from optuna_saturn.worker.log_lines import say


def main(config_path: str) -> None:
    config = json.load(sys.stdin)
    os.makedirs(os.path.dirname(config_path), mode=0o700, exist_ok=True)
    config["executor_pid"] = os.getppid()
    devices = [Device.from_json(d) for d in config["devices"]]
    config["pin_cores"] = pin_cores(devices)  # (this node's cores, and its GPU mask: SLURM's for this step)
    if devices[0].kind == "cuda":
        config["gpus"] = physical_gpus(devices)
        config["gpu_threads"] = max(1, len(available_cores()) // len(devices))
    with open(os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
        json.dump(config, f)
    leases = [lease_of(config, device) for device in config["devices"]]
    for device, lease in zip(config["devices"], leases):
        said = None
        while (holder := lease.take()) is not None:
            if holder and holder != said:
                say(f"optuna-saturn: device {Device.from_json(device)} waits for its lease on its node: {holder}.")
                said = holder
    from optuna_saturn.pools.warm_host import main as host

    host(config_path)


def lease_of(config: dict, device: dict) -> ActorLease:
    """The lease of ``device`` on this node, as a Ray actor takes its own: this sweep's hosts of other nodes on
    the same machine (a test cluster) share it; anyone else's holder is waited for."""
    return ActorLease(config, device, lease_names(Device.from_json(device)))


if __name__ == "__main__":
    main(sys.argv[1])
