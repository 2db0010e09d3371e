"""A fake GPU node for tests on a machine without one: every process believes it drives CUDA GPUs, runs its
tensors on the CPU, and writes down which GPU it was bound to.

Installed in a process by :func:`install` (``sitecustomize.py`` beside this file does it in every Python process
started with this folder first on ``PYTHONPATH`` and ``SATURN_FAKE_GPUS`` set: the executor, a fresh pool host, its
workers, Ray's workers). It fakes three things, and nothing of optuna-saturn's own:

- ``torch.cuda``: as many GPUs as ``CUDA_VISIBLE_DEVICES`` lists (``SATURN_FAKE_GPUS`` where it is unset);
  ``set_device``, ``init`` and ``current_device`` keep a per-process state; memory queries answer what a test's
  objective :func:`hold` s (0 otherwise); and every
  call that binds or initialises appends a line to ``SATURN_FAKE_GPU_LOG`` with the process's mask, ``RANK`` and
  ``LOCAL_RANK`` at that moment.
- tensors: a torch function mode runs everything asked of ``cuda`` on the CPU (factories' ``device=``,
  ``Tensor.to``/``.cuda``, ``Module.to``).
- the collectives: NCCL is gloo, and DDP drops ``device_ids`` for a module on the CPU.

What it shows: which mask, ``LOCAL_RANK`` and current device each rank of each trial got, that CUDA was
initialised only after the mask was set, and that each worker (local pool or Ray actor) stays on its own GPU.
What it cannot show: anything about real kernels, NCCL, GPU memory (queries answer 0), or code that calls the CUDA
driver without ``torch.cuda``'s Python API. See ``docs/internals.md``.
"""

from __future__ import annotations

import json
import os
import time
import types
from typing import Any

#: Each fake GPU's memory (what ``mem_get_info`` and ``get_device_properties`` say; nothing is counted against it).
FAKE_MEMORY = 80 * 2**30
_STATE: dict[str, Any] = {"initialized": False, "current": 0, "installed": False}


def _mask() -> list[str]:
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is None:
        return [str(i) for i in range(int(os.environ.get("SATURN_FAKE_GPUS", "0")))]
    return [e.strip() for e in mask.split(",") if e.strip()]


def record(event: str, **details: Any) -> None:
    """One line of what this process did to its (fake) GPUs, with where it stood then."""
    path = os.environ.get("SATURN_FAKE_GPU_LOG")
    if not path:
        return
    line = {
        "event": event,
        "pid": os.getpid(),
        "time": time.time(),
        "mask": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "rank": os.environ.get("RANK"),
        "local_rank": os.environ.get("LOCAL_RANK"),
        **details,
    }
    with open(path, "a", encoding="utf-8") as f:  # (one short write per line: lines of processes do not mix)
        f.write(json.dumps(line) + "\n")


def read_log(path: str | os.PathLike) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _ordinal(device: Any) -> int:
    import torch

    if device is None:
        return _STATE["current"]
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return _STATE["current"] if device.index is None else device.index


def _set_device(device: Any) -> None:
    index = _ordinal(device)
    if not 0 <= index < len(_mask()):
        mask = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise RuntimeError(f"CUDA error: invalid device ordinal {index} (CUDA_VISIBLE_DEVICES={mask})")
    _STATE["current"] = index
    record("set_device", device=index)


def _entries(variable: str) -> set[str]:
    return {e.strip() for e in os.environ.get(variable, "").split(",") if e.strip()}


def _init() -> None:
    """``SATURN_FAKE_GPU_BROKEN`` / ``SATURN_FAKE_GPU_HANGS``: GPUs (mask entries) whose context cannot be created:
    a process bound to one of them alone fails, or hangs, as on a GPU in a bad state."""
    mask = _mask()
    if not mask:
        raise RuntimeError("No CUDA GPUs are available")
    if len(mask) == 1 and mask[0] in _entries("SATURN_FAKE_GPU_BROKEN"):
        record("init_failed")
        raise RuntimeError(f"CUDA error: uncorrectable ECC error encountered (fake GPU {mask[0]})")
    if len(mask) == 1 and mask[0] in _entries("SATURN_FAKE_GPU_HANGS"):
        record("init_hangs")
        time.sleep(3600)
    if not _STATE["initialized"]:
        _STATE["initialized"] = True
        record("init")


def _is_initialized() -> bool:
    return bool(_STATE["initialized"])


def _answering(value: Any) -> Any:
    """A new function that answers ``value`` (one per patched name: torch._dynamo keeps a rule per function
    object, and refuses one object under two names)."""

    def answer(*args: Any, **kwargs: Any) -> Any:
        return value

    return answer


def hold(nbytes: int) -> None:
    """(For a test's objective.) Count ``nbytes`` more as allocated on this process's GPU, as a cache of GPU
    tensors that a module keeps would be: the memory queries answer it until the process ends."""
    _STATE["held"] = _STATE.get("held", 0) + nbytes


def _holding() -> Any:
    """A new function (see :func:`_answering`) that answers the bytes :func:`hold` counted."""

    def allocated(*args: Any, **kwargs: Any) -> int:
        return int(_STATE.get("held", 0))

    return allocated


def _patch_cuda(torch: Any) -> None:
    cuda = torch.cuda
    cuda.is_available = lambda: bool(_mask())
    cuda.device_count = lambda: len(_mask())
    cuda.is_initialized = _is_initialized
    cuda.init = _init
    cuda.set_device = _set_device
    cuda.current_device = lambda: _STATE["current"]
    cuda.get_device_name = _answering("Fake GPU")
    cuda.get_device_capability = _answering((9, 0))
    cuda.is_bf16_supported = _answering(True)
    cuda.mem_get_info = lambda device=None: (FAKE_MEMORY, FAKE_MEMORY)
    cuda.get_device_properties = lambda device=None: types.SimpleNamespace(
        name="Fake GPU", total_memory=FAKE_MEMORY, major=9, minor=0, multi_processor_count=132, uuid="fake"
    )
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        setattr(cuda, name, _holding())
    for name in ("reset_peak_memory_stats", "empty_cache", "synchronize", "ipc_collect", "manual_seed_all"):
        setattr(cuda, name, _answering(None))
    cuda.manual_seed = _answering(None)


def _patch_collectives(torch: Any) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    init_process_group = dist.init_process_group

    def on_gloo(*args: Any, backend: str | None = None, device_id: Any = None, **kwargs: Any) -> Any:
        record("init_process_group", backend=backend, device_id=None if device_id is None else str(device_id))
        return init_process_group(*args, backend="gloo" if backend in (None, "nccl") else backend, **kwargs)

    dist.init_process_group = on_gloo
    ddp_init = DistributedDataParallel.__init__

    def ddp_on_cpu(self: Any, module: Any, device_ids: Any = None, *args: Any, **kwargs: Any) -> None:
        ddp_init(self, module, None, *args, **kwargs)

    DistributedDataParallel.__init__ = ddp_on_cpu


def _is_cuda(device: Any) -> bool:
    import torch

    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.startswith("cuda")


def _cuda_to_cpu_mode(torch: Any) -> Any:
    from torch.overrides import TorchFunctionMode

    class CudaOnCpu(TorchFunctionMode):
        """What is asked of ``cuda`` runs on the CPU."""

        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = dict(kwargs or {})
            if _is_cuda(kwargs.get("device")):
                kwargs["device"] = "cpu"
            if func is torch.Tensor.cuda:
                return args[0]
            if func is torch.Tensor.to:
                args = tuple("cpu" if _is_cuda(a) else a for a in args)
            return func(*args, **kwargs)

    return CudaOnCpu()


def install() -> None:
    """Fake the GPUs in this process (and in what it forks). Idempotent."""
    if _STATE["installed"]:
        return
    import torch

    _patch_cuda(torch)
    _patch_collectives(torch)
    mode = _cuda_to_cpu_mode(torch)
    mode.__enter__()  # for the process's whole life (a fork inherits it)
    _STATE["installed"] = True
    _STATE["mode"] = mode
