"""How a rank failed, told by every rank of a job, so that the sweep acts on the rank that failed first.

Only rank 0 talks to the executor, and a rank that fails leaves its peers waiting in a collective (they are killed
after the grace period). So each rank that fails writes its own error file, with the error's kind:

- ``out_of_memory``: the option does not fit (more micro-batches may); never run again on the same option. Told by
  the exception's type (``torch.OutOfMemoryError``, ``MemoryError``) and by its message, since CUDA libraries
  raise it as other errors: NCCL's "Failed to CUDA calloc", cuBLAS's ``CUBLAS_STATUS_ALLOC_FAILED``, cuDNN's
  ``CUDNN_STATUS_ALLOC_FAILED``, the runtime's ``cudaErrorMemoryAllocation``;
- ``mismatch``: the trial's code cannot run under the strategy (``StrategyMismatch``): another option may;
- ``peer_gone``: a collective lost a peer (gloo's "connection reset by peer", NCCL's "remote process exited"):
  the effect of another rank's death, never a cause. A job whose only errors are these lost a rank that said
  nothing (killed, or its machine died): the sweep runs the trial again, as for any silent death;
- ``crash``: anything else.

The job's end carries the first failure in time that is not ``peer_gone`` (its peers' later errors are mostly
"connection closed"), or the first of those if that is all there is.
"""

from __future__ import annotations

import glob
import json
import os
import time
from dataclasses import asdict, dataclass

OUT_OF_MEMORY = "out_of_memory"
MISMATCH = "mismatch"
CRASH = "crash"
PEER_GONE = "peer_gone"

#: Messages of out-of-memory errors raised as something else than ``torch.OutOfMemoryError`` (lower case).
_OUT_OF_MEMORY_MESSAGES = (
    "out of memory",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "cudnn_status_not_enough_workspace",
    "cudaerrormemoryallocation",
    "cuda_error_out_of_memory",
    "failed to cuda calloc",
    "failed to cuda malloc",
)

#: Messages of a collective whose peer went away (lower case): gloo's and NCCL's (not a broken pipe: a DataLoader's
#: worker that died says that too, and running the trial again would not help it).
_PEER_GONE_MESSAGES = (
    "connection reset by peer",
    "connection closed by peer",
    "remote process exited",
    "nccl communicator was aborted",
)


@dataclass(frozen=True)
class RankFailure:
    """One rank's failure: when, what, its kind, whether the training steps had begun (an out-of-memory there may
    fit with more micro-batches; one while preparing the model will not), and under which strategy (a profiling
    job times several in turn)."""

    rank: int
    time: float
    error: str
    kind: str = CRASH
    in_steps: bool = False
    strategy: str = ""
    trial: int | None = None

    def __str__(self) -> str:
        return f"rank {self.rank}: {self.error}"


def error_kind(exc: BaseException, *, world_size: int) -> str:
    """The kind of ``exc`` (see the module's docstring), looking through the errors that caused it, for a rank of
    a job of ``world_size`` ranks (one rank has no peer to lose: a reset connection there is its code's)."""
    import torch

    from optuna_saturn.engines import StrategyMismatch

    seen: set[int] = set()
    peer_gone = False
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (torch.OutOfMemoryError, MemoryError)):
            return OUT_OF_MEMORY
        if isinstance(current, StrategyMismatch):
            return MISMATCH
        message = str(current).lower()
        if any(m in message for m in _OUT_OF_MEMORY_MESSAGES):
            return OUT_OF_MEMORY
        peer_gone = peer_gone or any(m in message for m in _PEER_GONE_MESSAGES)
        current = current.__cause__ or current.__context__
    return PEER_GONE if peer_gone and world_size > 1 else CRASH


def error_file(prefix: str, rank: int) -> str:
    return f"{prefix}.rank{rank}.error.json"


def record_failure(
    prefix: str,
    rank: int,
    error: str,
    kind: str,
    *,
    in_steps: bool = False,
    strategy: str = "",
    trial: int | None = None,
) -> None:
    """Leave this rank's failure where the pool reads it when the job ends."""
    failure = RankFailure(rank, time.time(), error[:4000], kind, in_steps, strategy, trial)
    path = error_file(prefix, rank)
    with open(path + ".partial", "w", encoding="utf-8") as f:  # (a full disk or a kill cuts this one, not the file)
        json.dump(asdict(failure), f)
    os.replace(path + ".partial", path)


def first_failure(prefix: str) -> RankFailure | None:
    """The failure of the job's rank that failed first, or None if no rank left one; a rank that lost a peer did
    not fail first, whatever its time (the peer's death is what it saw, and a killed peer leaves no file)."""
    failures = []
    for path in glob.glob(glob.escape(prefix) + ".rank*.error.json"):
        try:
            with open(path, encoding="utf-8") as f:
                failures.append(RankFailure(**json.load(f)))
        except (OSError, ValueError, TypeError):
            continue  # (a file a killed rank left half-written)
    return min(failures, key=lambda f: (f.kind == PEER_GONE, f.time), default=None)
