"""The device pool: CUDA GPUs when there are any, otherwise "CPU devices" (groups of cores, gloo backend).

DESIGN decision 4: every code path, real multi-process training included, must run on a machine without a GPU.
A CPU device is a set of cores: its worker runs as many threads as it has cores, so concurrent trials on a CPU
machine do not fight over the same cores, exactly as concurrent trials on a GPU machine never share a GPU. Workers
are pinned to their cores only while the pool leaves a core to the executor (see :func:`pin_cores`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

DeviceKind = Literal["cuda", "cpu"]


@dataclass(frozen=True)
class Device:
    """One schedulable device. ``cores`` is the CPU affinity of the process that drives it (empty: any core);
    ``index`` and ``cores`` are those of its machine. ``node`` names that machine in a cluster (empty: this one):
    a trial's devices are always on one node."""

    kind: DeviceKind
    index: int
    cores: tuple[int, ...] = ()
    node: str = ""
    mig: bool = False  # a MIG instance: one process per instance, and NCCL cannot span instances

    def __str__(self) -> str:
        return f"{self.node}/{self.kind}:{self.index}" if self.node else f"{self.kind}:{self.index}"

    def to_json(self) -> dict:
        return {"kind": self.kind, "index": self.index, "cores": list(self.cores), "node": self.node, "mig": self.mig}

    @classmethod
    def from_json(cls, data: dict) -> Device:
        return cls(
            kind=data["kind"],
            index=int(data["index"]),
            cores=tuple(data.get("cores", ())),
            node=data.get("node", ""),
            mig=bool(data.get("mig", False)),
        )


DeviceSpec = str | int | Sequence[int | str | Device]


def available_cores() -> list[int]:
    """Cores this process may run on (respects taskset/cgroup affinity, not just the machine's core count)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def pin_cores(devices: Sequence[Device]) -> bool:
    """Whether CPU workers should be pinned to their devices' cores: only when the devices leave one of this
    process's cores free. When they take every core, the executor's own work (relaying, planning, describing the
    next trial) and the pool host must run on a worker's core; pinned, a worker then waits for them on its core
    while another core may be free between steps, and the kernel balances better than a fixed split (measured
    on 2 cores, 2 devices, 4 pairs of sweeps of the same 8 trials: 1-6% less trial time unpinned)."""
    taken = {c for d in devices if d.kind == "cpu" for c in d.cores}
    return bool(set(available_cores()) - taken)


def cuda_device_count() -> int:
    """Number of visible CUDA devices (MIG instances listed in ``CUDA_VISIBLE_DEVICES`` count one each), without
    initialising CUDA in this (parent) process: torch counts them with NVML."""
    if mig_entries():
        return len(mig_entries())
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count()


def mig_entries() -> list[str]:
    """The MIG instances ``CUDA_VISIBLE_DEVICES`` lists (CUDA shows a process one of them; each worker gets one)."""
    mask = os.environ.get("CUDA_VISIBLE_DEVICES") or ""
    return [e.strip() for e in mask.split(",") if e.strip().startswith("MIG-")]


def _cuda_devices(count: int) -> list[Device]:
    """The first ``count`` visible GPUs, or MIG instances."""
    mig = bool(mig_entries())
    devices = [Device("cuda", i, mig=mig) for i in range(count)]
    refuse_partitioned(devices)
    warn_of_mixed_models(devices)
    return devices


def refuse_partitioned(devices: Sequence[Device]) -> None:
    """Refuse a whole GPU of ``devices`` in MIG mode, where no MIG instance names it: CUDA would show each worker
    the same first instance. Only the GPUs the sweep would use count: one partitioned for notebooks elsewhere on
    the node, outside the mask, is none of its business."""
    whole = [d for d in devices if d.kind == "cuda" and not d.mig and not d.node]
    if not whole:
        return
    from optuna_saturn.nvml import in_mig_mode

    partitioned = in_mig_mode(physical_gpus(whole))
    if partitioned:
        raise ValueError(
            f"GPU(s) {partitioned} (as CUDA_VISIBLE_DEVICES names them) are in MIG mode: name the MIG instances the "
            "sweep may use in CUDA_VISIBLE_DEVICES (`nvidia-smi -L` lists their MIG-... UUIDs), e.g. "
            "CUDA_VISIBLE_DEVICES=MIG-<uuid>,MIG-<uuid>; each instance is then one device, for one-device "
            "strategies. Or leave them out of CUDA_VISIBLE_DEVICES or devices=, or turn MIG mode off "
            "(`nvidia-smi -mig 0`)."
        )


def warn_of_mixed_models(devices: Sequence[Device]) -> None:
    """Say so where the pool's GPUs (or MIG instances) are not all of one model: the profiles are keyed by the
    first one's model, so a profile measured on one model prices the others, every GPU gets the least memory
    among them, and a trial that spans two models runs at the slower one's pace."""
    whole = [d for d in devices if d.kind == "cuda" and not d.node]
    if len(whole) < 2:
        return
    from optuna_saturn.nvml import gpu_model

    models = {str(d): gpu_model(entry) for d, entry in zip(whole, physical_gpus(whole))}
    if len({m for m in models.values() if m is not None}) > 1:
        import optuna

        listed = ", ".join(f"{d}: {m[0]} {m[1] / 2**30:.0f} GiB" for d, m in models.items() if m is not None)
        optuna.logging.get_logger("optuna.saturn").warning(
            f"The pool's GPUs are of different models ({listed}). The sweep prices them all as {whole[0]} (its "
            "profiles, its speed), gives each the least memory among them, and a trial that spans two models runs "
            "at the slower one's pace. For plans that hold, name GPUs of one model in CUDA_VISIBLE_DEVICES or "
            "devices= (a sweep per model, each on its own GPUs)."
        )


def largest_trial(devices: Sequence[Device]) -> int:
    """The most devices one trial may span on this pool: MIG instances cannot form a process group (NCCL does
    not span them), so a pool of them runs one-device trials only."""
    return 1 if any(d.mig for d in devices) else len(devices)


def cpu_devices(count: int, *, allow_shared_cores: bool = False) -> list[Device]:
    """Split this process's cores into ``count`` CPU devices of (nearly) equal size."""
    cores = available_cores()
    if count < 1:
        raise ValueError(f"devices must be >= 1, got {count}.")
    if count > len(cores) and not allow_shared_cores:
        raise ValueError(
            f"Asked for {count} CPU devices but this process may use only {len(cores)} cores, and a CPU device is "
            f"a group of whole cores. Pass devices={len(cores)} or fewer (--devices {len(cores)}), or "
            "allow_shared_cores=True (--allow-shared-cores) to let devices share cores (their trials will slow each "
            "other down)."
        )
    if count <= len(cores):
        groups = [cores[i * len(cores) // count : (i + 1) * len(cores) // count] for i in range(count)]
    else:
        groups = [[cores[i % len(cores)]] for i in range(count)]
    return [Device("cpu", i, tuple(g)) for i, g in enumerate(groups)]


def resolve_devices(
    spec: DeviceSpec = "auto", *, allow_shared_cores: bool = False, n_cuda: int | None = None
) -> list[Device]:
    """Turn the user's ``devices=`` argument into concrete devices, or explain what is wrong with it.

    ``"auto"``: every visible CUDA GPU, else one CPU device per core. ``"cpu"`` / ``"cuda"``: force the kind.
    ``"cpu:N"``: N CPU devices. An int: that many devices of the auto kind. A list: CUDA indices (ints),
    ``"cuda:N"`` names, or :class:`Device` objects (CPU devices with the cores of your choice). ``n_cuda``: the
    GPUs in sight, where the caller counted them (the command line's checks, without torch).
    """
    n_cuda = cuda_device_count() if n_cuda is None else n_cuda
    if isinstance(spec, str):
        if spec == "auto":
            return _cuda_devices(n_cuda) if n_cuda else cpu_devices(len(available_cores()))
        if spec == "cuda":
            if not n_cuda:
                raise ValueError("devices='cuda' but no CUDA GPU is visible. Use devices='auto' or 'cpu'.")
            return _cuda_devices(n_cuda)
        if spec == "cpu":
            return cpu_devices(len(available_cores()))
        if spec.startswith("cpu:") and spec[4:].isdigit():
            return cpu_devices(int(spec[4:]), allow_shared_cores=allow_shared_cores)
        raise ValueError(f"Unknown devices={spec!r}. Use 'auto', 'cpu', 'cuda', 'cpu:N', an int or a list.")
    if isinstance(spec, bool):
        raise TypeError("devices must be 'auto', an int or a list, not a bool.")
    if isinstance(spec, int):
        if n_cuda:
            if spec > n_cuda:
                raise ValueError(
                    f"devices={spec} but only {n_cuda} CUDA GPUs are visible. Pass devices={n_cuda} or fewer."
                )
            return _cuda_devices(spec)
        return cpu_devices(spec, allow_shared_cores=allow_shared_cores)
    return _devices_from_list(list(spec), n_cuda)


def _devices_from_list(items: list, n_cuda: int) -> list[Device]:
    devices: list[Device] = []
    for item in items:
        if isinstance(item, Device):
            devices.append(item)
        elif isinstance(item, int) or (isinstance(item, str) and item.startswith("cuda:")):
            index = item if isinstance(item, int) else int(item[5:])
            if index >= n_cuda:
                raise ValueError(
                    f"CUDA device {index} does not exist: {n_cuda} CUDA GPUs are visible "
                    f"(indices 0..{n_cuda - 1}). On a CPU-only machine use devices=N or 'cpu'."
                )
            devices.append(Device("cuda", index, mig=bool(mig_entries())))
        else:
            raise ValueError(f"Cannot read device {item!r}: use an int (CUDA index), 'cuda:N' or a Device.")
    if not devices:
        raise ValueError("devices is an empty list; give at least one device.")
    if len({(d.kind, d.index) for d in devices}) != len(devices):
        raise ValueError(f"devices lists a device twice: {[str(d) for d in devices]}.")
    if len({d.kind for d in devices}) > 1:
        raise ValueError("devices mixes CUDA and CPU devices; a pool holds one kind.")
    refuse_partitioned(devices)
    warn_of_mixed_models(devices)
    return devices


def physical_gpus(devices: Sequence[Device]) -> list[str]:
    """What to put in a trial's ``CUDA_VISIBLE_DEVICES`` for these GPUs.

    A CUDA device's index counts the GPUs this process sees. When the process itself runs under a mask
    (``CUDA_VISIBLE_DEVICES=4,5,6,7`` from SLURM, Kubernetes or a shared host), index 0 is the mask's first
    entry, GPU 4: a child's mask must name the entries (indices, UUIDs or MIG names), not the indices."""
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is None:
        return [str(d.index) for d in devices]
    entries = [entry.strip() for entry in mask.split(",") if entry.strip()]
    missing = [d.index for d in devices if d.index >= len(entries)]
    if missing:
        raise RuntimeError(
            f"CUDA device {missing[0]} is not in this process's CUDA_VISIBLE_DEVICES={mask!r} "
            f"({len(entries)} entries). Pass devices= within what the mask shows."
        )
    return [entries[d.index] for d in devices]
