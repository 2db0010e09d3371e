"""A worker's memory between and during runs: giving back what a run held, and measuring what a run added.

A warm worker runs one job after another, and a profiling job times several strategies in one process, so each
run must start with nothing of the last one allocated: an engine still referenced, or a CUDA cache still held,
would make the next option look larger than it is, or run out of memory, and the planner would learn a false
limit. The order matters (:func:`collect` before the process group goes, :func:`release_memory` after): what
references the job's objects is dropped first (the clipping registry, DeepSpeed's engine, see
:meth:`~optuna_saturn.engines.Engine.release`), then the garbage collector frees the cycles they sit in, then the
device finishes its queued kernels, and only then is the cache emptied and the peak counter reset.

A run's peak is what it added: on a GPU the most it allocated (its job starts with nothing allocated), with the
allocator's reserve beside it; on a CPU device the most the process held resident past what it held when the
run began (the libraries a worker imports are not the run's, as a GPU's CUDA context is not counted either).
"""

from __future__ import annotations

import gc
import resource

import torch


def collect(device: torch.device) -> None:
    """Free what the last run left unreferenced (cycles included), and let the device finish its work on it."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release_memory(device: torch.device) -> None:
    """Between two runs in one process, give back what the first one held, and start counting peaks anew."""
    collect(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    reset_peak(device)


def reset_peak(device: torch.device) -> None:
    """Start counting this process's peak memory anew."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # Linux >= 4.0: reset the peak resident set ("high water mark") to the current one
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        pass  # then a later run's peak may include an earlier one's (an overestimate, never an under)


class RunMemory:
    """What one run adds to this process's memory, from its start (see the module's docstring)."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        reset_peak(device)
        self._start = 0.0 if device.type == "cuda" else resident_memory()

    def peak(self) -> float:
        """The most this run has held at once, in bytes."""
        return max(0.0, peak_memory(self._device) - self._start)

    def reserved_peak(self) -> float:
        """The most the CUDA allocator held for this run, fragmentation included (0 on a CPU device)."""
        return float(torch.cuda.max_memory_reserved(self._device)) if self._device.type == "cuda" else 0.0


def peak_memory(device: torch.device) -> float:
    """Peak memory of this rank: allocated on the GPU, or this process's peak resident set on CPU."""
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    return float(_status_kib("VmHWM") * 1024 or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def resident_memory() -> float:
    """This process's resident set now, in bytes (0 where /proc is missing)."""
    return float(_status_kib("VmRSS") * 1024)


def _status_kib(field: str) -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
