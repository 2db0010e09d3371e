"""What the executor's memory options mean in bytes: the memory the planner gives each device
(``device_memory``), and the resident memory past which a warm worker is replaced (``worker_memory_limit``)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from optuna_saturn.devices import Device
from optuna_saturn.pools.kinds import Placement
from optuna_saturn.profiler._hardware import device_memory_bytes


def device_capacity(given: int | None, devices: Sequence[Device], placement: Placement) -> int | None:
    """The memory the planner gives each device: the user's ``device_memory`` (``given``) where it is less than
    what the devices have (a cluster node's, as measured there; this machine's, measured by the pricer)."""
    if placement.device_memory is not None:
        return placement.device_memory if given is None else min(given, placement.device_memory)
    if given is None or devices[0].kind != "cuda":
        return given
    return min(given, device_memory_bytes(devices))


def worker_memory_limit_bytes(limit: float | str | None, placement: Placement) -> float | None:
    """``"auto"``: this machine's memory over its devices (on a cluster, whose nodes differ from it: no limit)."""
    if limit is None or (limit == "auto" and not placement.machine_memory_limit):
        return None
    if limit == "auto":
        import psutil

        return float(psutil.virtual_memory().total) / len(placement.devices)
    return float(parse_bytes(limit, "worker_memory_limit"))


def parse_bytes(value: int | float | str, name: str) -> int:
    """``value`` in bytes: a number, or a string such as ``"2GiB"``, ``"512MiB"``, ``"1.5GB"``."""
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
    units.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number of bytes or a string like '2GiB', not a bool.")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        match = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([A-Za-z]*)", str(value).strip())
        number, unit = (float(match[1]), match[2].upper()) if match else (-1.0, "")
    if unit not in units or number <= 0:
        raise ValueError(f"{name}={value!r}: give a positive number of bytes or a string like '2GiB' or '512MiB'.")
    return int(number * units[unit])
