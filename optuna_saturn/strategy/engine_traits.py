"""What the package knows of an engine outside the worker that runs it, declared by the engine in one place.

An engine (:mod:`optuna_saturn.engines`) applies a strategy inside each worker and imports what it needs to (FSDP's
modules take a second to import). The executor's side needs to know things about it without importing any of that:
which knobs a template of it may set, how much model state it keeps on each device, whether it trades compute for
memory, which checkpoints it can resume, which libraries it runs on. Each engine declares these in a small
:class:`EngineTraits` subclass, found by name through :mod:`optuna_saturn.strategy.engine_registry`; nothing else
in the package branches on an engine's name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

#: The checkpoint formats (see :mod:`optuna_saturn.training.checkpoint`): torch's reshardable one, and DeepSpeed's.
DCP = "torch.distributed.checkpoint"
DEEPSPEED = "deepspeed"


class SavedCheckpoint(Protocol):
    """What :meth:`EngineTraits.can_resume` reads of a checkpoint's record."""

    @property
    def format(self) -> str: ...
    @property
    def world_size(self) -> int: ...
    @property
    def strategy(self) -> str: ...


@dataclass(frozen=True)
class Knob:
    """A setting of a template's ``[knobs]`` table that an engine understands."""

    must_be: str  # what its value must be, as an error message says it
    meaning: str
    valid: Callable[[Any], bool]


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_increasing_counts(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(f, int) and not isinstance(f, bool) and f >= 1 for f in value)
        and value == sorted(set(value))
    )


GRADIENT_ACCUMULATION = Knob(
    "a non-empty, increasing list of positive ints, e.g. [1, 2, 4, 8]",
    "micro-batch counts to try: more only when fewer runs out of memory",
    _is_increasing_counts,
)
ACTIVATION_CHECKPOINTING = Knob("true or false", "recompute each block's activations in backward", _is_bool)
CPU_OFFLOAD = Knob("true or false", "keep sharded state in host memory", _is_bool)


class EngineTraits:
    """An engine as the executor's side sees it. The defaults describe a data-parallel engine that keeps whole
    replicas and saves torch's reshardable checkpoints; a subclass overrides what differs. One instance per
    registered name (:func:`~optuna_saturn.strategy.engine_registry.traits_of`)."""

    #: ``"module:Class"`` of the :class:`~optuna_saturn.engines.Engine` subclass that applies the strategy inside
    #: each worker: imported there only.
    engine: ClassVar[str] = ""
    #: How ``trial.checkpoint()`` saves its training state (the engine class's ``checkpoint_format`` too).
    checkpoint_format: ClassVar[str] = DCP
    #: The ``[knobs]`` a template of this engine may set. Every engine takes ``gradient_accumulation``: the
    #: profiler splits batches by it, whatever the strategy.
    knobs: ClassVar[Mapping[str, Knob]] = {"gradient_accumulation": GRADIENT_ACCUMULATION}
    #: Libraries it runs on besides torch, each a distribution importable under its own name: their versions are
    #: part of its profiles' key (a new version may change its speed), and a warm host imports them before its
    #: workers fork (so no trial pays for it).
    libraries: ClassVar[tuple[str, ...]] = ()
    #: It runs one plain process (no process group): a template of it has ``max_devices = 1`` or
    #: ``one_process = true``, and code that would start its own DDP there (Accelerate's own ``Accelerator()``)
    #: computes what one process computes.
    runs_one_process: ClassVar[bool] = False
    #: Its library compiles native ops the first time a process needs them (DeepSpeed's): the pool builds them
    #: before any timed run, and stall detection allows for a build (see :mod:`optuna_saturn.pools.deepspeed_ops`).
    builds_ops: ClassVar[bool] = False

    def __init__(self, name: str) -> None:
        self.name = name

    def knob_problem(self, key: str, value: Any) -> str | None:
        """Why a template of this engine cannot set ``knobs.<key> = value``, naming the fix; None if it can."""
        knob = self.knobs.get(key)
        if knob is None:
            known = "; ".join(f"{k}: {v.must_be} ({v.meaning})" for k, v in self.knobs.items())
            return f"unknown knob {key!r} for engine {self.name!r}. Known knobs of this engine: {known}."
        if not knob.valid(value):
            return f"knobs.{key} must be {knob.must_be}; got {value!r}."
        return None

    def state_bytes(
        self, params: float, grads: float, states: float, devices: int, knobs: Mapping, config: Mapping
    ) -> float:
        """Bytes of model state each of ``devices`` devices holds, given the whole model's parameters, gradients
        and optimizer state in bytes (a lower bound for the profiler's memory check: activations come on top)."""
        return params + grads + states

    def trades_compute_for_memory(self, knobs: Mapping, config: Mapping) -> bool:
        """Whether a strategy of this engine with these knobs and launcher config does more than the step's plain
        compute to save memory (recomputation, offload): then it sets no floor under other strategies' prices."""
        return bool(knobs.get("activation_checkpointing"))

    def can_resume(self, saved: SavedCheckpoint, world_size: int, strategy: str | None = None) -> bool:
        """Whether a run of this engine on ``world_size`` ranks, under ``strategy``, can load ``saved``. Torch's
        format reshards: any run that saves in it can load it, whatever wrote it."""
        return saved.format == self.checkpoint_format
