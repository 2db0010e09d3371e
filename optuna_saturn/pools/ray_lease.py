"""A Ray sweep's device leases (:mod:`optuna_saturn.leases`), taken on each node by the device's actor, so that a
Ray sweep and a local sweep on one machine take turns on the devices they share, as two local sweeps do. (Ray's
own resources keep two Ray sweeps apart, not a Ray sweep and a sweep Ray does not know of.)

Why the actor takes it: a lease is an ``flock`` on a file of the node, so only a process on the node can hold it;
the actor is the process that uses the device, holds the lease while it lives, and the kernel frees it when the
actor dies, however it dies (recycled, failed, killed at the sweep's end). It leases the device it really holds: a
GPU by the GPU Ray gave it (its UUID, as every sweep on the machine names it), taken before the actor makes its
CUDA context; a CPU device by its cores, the Ray node's CPUs laid over the cores the actor may run on.

Waiting shows, and is no failed start: the actor's ``ready`` call tries the lease for up to
:data:`ANSWER_SECONDS`, and while another sweep holds it answers who does; the pool says so, once per holder, and
asks again (:class:`LeaseWaits`). Only once leased does the actor start for real (imports, the CUDA context). A
waiting device is simply not ready: the sweep plans on the devices that are, and its ``timeout`` still ends it.
"""

from __future__ import annotations

import os
import time

import optuna

from optuna_saturn.devices import Device
from optuna_saturn.leases import (
    LEASES_ENV,
    POLL_SECONDS,
    DeviceLeases,
    Holder,
    gpu_lease_name,
    lease_names,
    leases_folder,
    read_holders,
)

_logger = optuna.logging.get_logger("optuna.saturn.runner")

#: How long an actor's ``ready`` call tries its lease before it answers that it still waits.
ANSWER_SECONDS = 2.0


def driver_leases() -> str | None:
    """The driver's ``OPTUNA_SATURN_LEASES``, for its actors: an actor's environment is its raylet's, not the
    driver's, and the sweep's choice (a folder, or off) holds on each of its nodes."""
    return os.environ.get(LEASES_ENV)


def actor_lease_names(device: dict, gpu: str | None) -> list[str]:
    """The lease files of an actor's device: its GPU (``gpu``, the ``CUDA_VISIBLE_DEVICES`` entry Ray gave it),
    or its cores (the Ray node's CPU numbers, laid over the cores this process may use)."""
    if device["kind"] == "cuda" and gpu is not None:
        return [gpu_lease_name(gpu)]
    usable = sorted(os.sched_getaffinity(0))
    cores = tuple(sorted({usable[core % len(usable)] for core in device["cores"]}))
    return lease_names(Device(device["kind"], device["index"], cores))


class ActorLease:
    """The lease one actor holds on its device while it lives (see the module's docstring)."""

    def __init__(self, config: dict, device: dict, names: list[str]) -> None:
        if config.get("leases") is not None:
            os.environ[LEASES_ENV] = config["leases"]
        folder = leases_folder()
        self._sweep = str(config["sweep"])
        self._device = str(Device.from_json(device))
        self._names = names
        self._held = False
        self._folder = folder
        self._leases = None  # (leasing off: nothing to take)
        if folder is not None:
            self._leases = DeviceLeases(
                [Device.from_json(device)],
                folder=folder,
                study=str(config.get("study", "")),
                names=self._names_of,
                about={"ray_sweep": self._sweep, "device": self._device, "pool": str(config.get("pool", "Ray"))},
                shares_with=self._fellow,
            )

    def take(self, seconds: float = ANSWER_SECONDS) -> str | None:
        """None once the lease is held (or leasing is off); otherwise, after ``seconds`` of trying, who holds it
        ("" while it is this device's previous actor, which is on its way out)."""
        deadline = time.monotonic() + seconds
        while self._leases is not None and not self._held:
            missing = self._leases.take_free()
            if not missing:
                self._held = True
            elif time.monotonic() >= deadline:
                return self._who_holds(missing)
            else:
                time.sleep(POLL_SECONDS)
        return None

    def _who_holds(self, missing: list[Device]) -> str:
        assert self._folder is not None
        holder = next((h for _, h in read_holders(self._folder, missing, names=self._names_of) if h), None)
        if holder is None:
            return "another sweep"
        if holder.ray_sweep == self._sweep and holder.device == self._device:
            return ""
        return holder.describe()

    def _names_of(self, device: Device) -> list[str]:
        return self._names

    def _fellow(self, holder: Holder) -> bool:
        """This sweep's actor of another device (another Ray node on this machine): one sweep, which splits the
        machine as its nodes were told to."""
        return holder.ray_sweep == self._sweep and holder.device != self._device


class LeaseWaits:
    """The pool's side: which devices' actors wait for their lease, said once per change of holder."""

    def __init__(self) -> None:
        self._holders: dict[str, str] = {}  # device -> who holds its lease, as last said

    def waits(self, device: str, holder: str) -> None:
        if holder and self._holders.get(device) != holder:
            _logger.warning(f"Device {device} waits for its lease on its node: held by {holder}.")
            self._holders[device] = holder

    def leased(self, device: str) -> None:
        if self._holders.pop(device, None) is not None:
            _logger.info(f"Device {device} has its lease now; its worker is starting.")
