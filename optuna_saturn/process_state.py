"""The global state of a Python process that a trial's code may change, saved once and put back later.

Two places run user code in a process that outlives it: the executor describes each trial by running its
objective up to the first training loop, and a warm worker runs trial after trial. Whatever one trial sets
(random seeds, the default dtype, thread counts, environment variables a strategy sets, the working folder,
cuDNN flags) must not be seen by the next, nor by the executor.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class ProcessState:
    """A snapshot; :meth:`restore` puts it back (any number of times)."""

    torch_rng: torch.Tensor
    python_rng: Any
    numpy_rng: Any
    default_dtype: torch.dtype
    grad_enabled: bool
    num_threads: int
    deterministic: bool
    environ: dict[str, str]
    cwd: str
    backend_flags: dict[str, Any]
    accelerate: tuple[dict, ...] | None  # Accelerate's per-process states (see _accelerate_states)
    cuda_rng: list[torch.Tensor]  # every visible GPU's generator (dropout masks of a trial that does not seed)

    @classmethod
    def capture(cls) -> ProcessState:
        import numpy

        return cls(
            cuda_rng=torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
            torch_rng=torch.get_rng_state(),
            python_rng=random.getstate(),
            numpy_rng=numpy.random.get_state(),
            default_dtype=torch.get_default_dtype(),
            grad_enabled=torch.is_grad_enabled(),
            num_threads=torch.get_num_threads(),
            deterministic=torch.are_deterministic_algorithms_enabled(),
            environ=dict(os.environ),
            cwd=os.getcwd(),
            backend_flags=_backend_flags(),
            accelerate=_accelerate_state(),
        )

    def restore(self) -> None:
        import numpy

        torch.set_rng_state(self.torch_rng)
        if self.cuda_rng:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        random.setstate(self.python_rng)
        numpy.random.set_state(self.numpy_rng)
        torch.set_default_dtype(self.default_dtype)
        torch.set_grad_enabled(self.grad_enabled)
        if torch.get_num_threads() != self.num_threads:
            torch.set_num_threads(self.num_threads)
        if torch.are_deterministic_algorithms_enabled() != self.deterministic:  # (setting it imports torch._dynamo)
            torch.use_deterministic_algorithms(self.deterministic)
        if dict(os.environ) != self.environ:
            os.environ.clear()
            os.environ.update(self.environ)
        os.chdir(self.cwd)
        _set_backend_flags(self.backend_flags)
        _forget_strategy_state()
        _set_accelerate_state(self.accelerate)
        _forget_compiled_code()


def _forget_compiled_code() -> None:
    """What ``torch.compile`` kept of a trial: its compiled frames and guards (past its cache limit, the next
    trial's functions would silently run eager, slower than profiled) and the CUDA graphs of
    ``mode="reduce-overhead"`` with their memory pools."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:  # (0.01 ms when nothing was compiled)
        dynamo.reset()


def reset_library_state() -> None:
    """Process-wide state of the libraries a trial's code or its strategy set up, which would outlive it.

    Accelerate keeps one ``PartialState``/``AcceleratorState`` per process: left over from a trial (or from
    describing a Trainer objective in the executor, whose process warm workers may be forked from), it tells
    the next trial's accelerator it runs alone, and one rank then skips a collective its peers wait in. DeepSpeed
    keeps its communication backend and process groups (bound to the old process group) in module globals."""
    _forget_strategy_state()
    _set_accelerate_state(None)


def _accelerate_states() -> tuple[dict, ...]:
    """Accelerate's per-process singletons (each a class-level dict every instance shares), if it is imported."""
    state = sys.modules.get("accelerate.state")
    if state is None:
        return ()
    return state.PartialState._shared_state, state.AcceleratorState._shared_state, state.GradientState._shared_state


def _accelerate_state() -> tuple[dict, ...] | None:
    shared = _accelerate_states()
    return tuple(dict(d) for d in shared) if shared else None


def _set_accelerate_state(saved: tuple[dict, ...] | None) -> None:
    """Back to ``saved`` (``None``: nothing set up, as before the first ``Accelerator``)."""
    for shared, values in zip(_accelerate_states(), saved or ({}, {}, {})):
        shared.clear()
        shared.update(values)


def _forget_strategy_state() -> None:
    """DeepSpeed's communication globals and the clipping registry: bound to a process group that is gone."""
    from optuna_saturn.engines import _clipping

    _clipping.forget_all()
    for name in ("deepspeed.comm.comm", "deepspeed.utils.groups"):  # back to their import-time values
        module = sys.modules.get(name)
        for attribute, value in vars(module).items() if module is not None else ():
            if attribute in ("cdb", "mpu", "mesh_device") or (attribute.startswith("_") and attribute.isupper()):
                if isinstance(value, dict):
                    value.clear()
                elif not isinstance(value, (str, int, float, bool)):
                    setattr(module, attribute, None)


def _backend_flags() -> dict[str, Any]:
    return {
        "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "cudnn.deterministic": torch.backends.cudnn.deterministic,
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def _set_backend_flags(flags: dict[str, Any]) -> None:
    torch.backends.cudnn.benchmark = flags["cudnn.benchmark"]
    torch.backends.cudnn.deterministic = flags["cudnn.deterministic"]
    torch.backends.cuda.matmul.allow_tf32 = flags["cuda.matmul.allow_tf32"]
    torch.backends.cudnn.allow_tf32 = flags["cudnn.allow_tf32"]
    torch.set_float32_matmul_precision(flags["float32_matmul_precision"])


@contextlib.contextmanager
def restored_process_state() -> Iterator[None]:
    """Whatever the code inside changes of the process's global state is undone when it leaves."""
    state = ProcessState.capture()
    try:
        yield
    finally:
        state.restore()
