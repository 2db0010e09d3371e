"""A model built for a sharding strategy (fsdp, zero3) never sits whole in a rank's host memory.

The user's objective builds its model before ``trial.prepare``, on every rank: a model that fits the devices only
when sharded would sit whole in each rank's host memory (eight copies on an eight-GPU node) before the engine cut
it. So, while the objective runs up to ``trial.prepare``, each module's parameters are cut as soon as the module is
registered in its parent, that is once its own ``__init__`` has set them: the rank keeps its dim-0 chunk
(``torch.chunk(param, world_size)[rank]``, FSDP's own layout) and the parameter's data becomes one element seen in
its shape (a stride-0 view: shape, dtype and device stay, the memory goes). It stays the same ``Parameter``
object, so an optimizer made from ``model.parameters()`` still holds it. Values are computed exactly as in one
process: each module is built whole with the same random draws in the same order, then cut. At most one module
(and the chunks) is whole at a time.

Code that touches a cut parameter later (Hugging Face's ``post_init`` initialising weights again, ``.to(device)``,
reading a value) gets it whole again first: every rank gathers the chunks (every rank runs the same code before
``trial.prepare``), so the code sees, and may change, the value one process would have. Parameters made whole are
cut again, oldest first, once they hold more than twice the largest parameter. The one case this cannot follow: a
view of a parameter's data kept while others are touched past that (``w = a.weight.data``, then other weights,
then ``w.normal_()``): its parameter was cut again meanwhile, and what the view writes is lost.

``trial.prepare`` ends it (:meth:`ShardedBuild.finish`): the engine gets the model with its chunks, and every cut
parameter of anything else the objective built is made whole again.
"""

from __future__ import annotations

import ctypes
import functools
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode, _get_current_function_mode, _pop_mode
from torch.utils._pytree import tree_flatten

#: What reads only a tensor's metadata: answered by the cut parameter itself, without gathering it.
_METADATA = frozenset(
    [
        *(
            getattr(torch.Tensor, name).__get__  # (the getters of these attributes, as torch functions see them)
            for name in ("shape", "ndim", "dtype", "requires_grad", "is_leaf", "grad", "layout")
        ),
        torch.Tensor.size,
        torch.Tensor.dim,
        torch.Tensor.numel,
        torch.Tensor.nelement,
        torch.Tensor.element_size,
        torch.Tensor.is_floating_point,
        torch.Tensor.is_complex,
        torch.Tensor.requires_grad_,
        torch.Tensor.__hash__,
    ]
)


class ShardedBuild(TorchFunctionMode):
    """Around the objective until ``trial.prepare`` (a context manager): cuts each module's parameters once the
    module is built, and makes a cut parameter whole again wherever code touches it."""

    def __init__(self, rank: int, world_size: int, group: Any) -> None:
        super().__init__()
        self.rank, self.world_size, self.group = rank, world_size, group
        # id(param) -> (the parameter, this rank's chunk), in the order they were cut: the same on every rank
        self._cut_params: dict[int, tuple[weakref.ref[torch.Tensor], torch.Tensor]] = {}
        # cut parameters made whole for code that touched them, by id, the least recently touched first
        self._whole: dict[int, torch.Tensor] = {}
        self._largest = 0  # the largest parameter cut, in bytes: parameters made whole stay within twice that
        self._hook: Any = None
        self._on_stack = False
        self._busy = False
        self._finished = False
        self.gathers = 0  # how many times a cut parameter was made whole (for tests)

    # -- the context -------------------------------------------------------------------------------------------
    def __enter__(self) -> ShardedBuild:
        self._hook = torch.nn.modules.module.register_module_module_registration_hook(self._registered)
        self._on_stack = True
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        """The objective is over: what it cut without preparing it is dropped (nothing uses it any more, and a
        gather here could wait for ever on a rank that failed)."""
        self._finished = True
        self._stop()
        self._cut_params.clear()
        self._whole.clear()

    def _stop(self) -> None:
        """Nothing is cut any more, and the mode leaves torch's stack (the training loop runs without it)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._on_stack:
            self._on_stack = False
            if _get_current_function_mode() is not self:
                raise RuntimeError(
                    "A TorchFunctionMode entered inside the objective is still active at trial.prepare(): exit it "
                    "before trial.prepare() (optuna-saturn's sharded model construction ends there)."
                )
            _pop_mode()

    def finish(self, model: torch.nn.Module) -> dict[int, torch.Tensor]:
        """At ``trial.prepare(model, ...)``: this rank's chunk of each of ``model``'s cut parameters, by the
        parameter's ``id`` (the parameter itself holds one element; wrappers the engine adds may rename it, but
        keep the object). Nothing is cut after this; whatever else was cut is whole again. Once only: later calls
        (another model prepared) get nothing."""
        if self._finished:
            return {}
        self._finished = True
        self._cut_again()
        self._stop()
        chunks: dict[int, torch.Tensor] = {}
        for param in model.parameters():
            kept = self._cut_params.pop(id(param), None)
            if kept is not None:
                chunks[id(param)] = kept[1]
        self._restore_all()
        return chunks

    # -- cutting and gathering ---------------------------------------------------------------------------------
    def _registered(self, parent: torch.nn.Module, name: str, module: torch.nn.Module | None) -> None:
        """A module was built and set on its parent: cut its own parameters (its children were cut when they
        were registered in it)."""
        if module is None or self._busy:
            return
        for param in module.parameters(recurse=False):
            self._cut(param)
        give_back_freed_memory()

    def _cut(self, param: torch.Tensor) -> None:
        too_small = param.dim() == 0 or param.size(0) < self.world_size
        if self._is_cut(param) or param.is_meta or param.numel() == 0 or too_small:
            return  # already cut, not built here (meta), or too small to matter
        self._busy = True
        try:
            chunks = torch.chunk(param.detach(), self.world_size, dim=0)
            # (torch.chunk gives fewer chunks than asked where the rows run out: those ranks keep none)
            mine = chunks[self.rank].clone() if self.rank < len(chunks) else param.detach()[:0].clone()
            # One element seen in the parameter's shape: its shape, dtype and device stay (a parameter's data cannot
            # move to the meta device), its memory goes.
            param.data = torch.zeros((), dtype=param.dtype, device=param.device).expand(param.shape)
        finally:
            self._busy = False
        self._cut_params[id(param)] = (weakref.ref(param), mine)
        self._largest = max(self._largest, _bytes(param))

    def _is_cut(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is a parameter cut here. By identity, not by ``id`` alone: a cut parameter the
        objective dropped is gone, and a new tensor may get its ``id`` (its stale entry is dropped then)."""
        kept = self._cut_params.get(id(tensor))
        if kept is None:
            return False
        if kept[0]() is tensor:
            return True
        del self._cut_params[id(tensor)]
        return False

    def _make_whole(self, param: torch.Tensor) -> None:
        _, chunk = self._cut_params.pop(id(param))
        self._busy = True
        try:
            param.data = gather_chunks(chunk, tuple(param.shape), self.world_size, self.group)
        finally:
            self._busy = False
        self.gathers += 1

    def _cut_again(self, keep: set[int] | None = None) -> None:
        """Parameters made whole are cut again, the least recently touched first, until what stays whole (``keep``,
        ids, always) is within twice the largest parameter; all of them without ``keep``."""
        budget = 2 * self._largest if keep is not None else 0
        while sum(map(_bytes, self._whole.values())) > budget:
            oldest = next((key for key in self._whole if key not in (keep or ())), None)
            if oldest is None:
                break
            self._cut(self._whole.pop(oldest))
        give_back_freed_memory()

    def _restore_all(self) -> None:
        """Every parameter still cut made whole: whatever the objective built besides the prepared model (a loss
        module, a frozen teacher) runs as it was built. In the order they were cut: the same on every rank."""
        for ref, _ in list(self._cut_params.values()):
            param = ref()
            if param is not None:
                self._make_whole(param)
        self._cut_params.clear()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if (self._cut_params or self._whole) and not self._busy and func not in _METADATA:
            tensors = {id(t): t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
            for key in tensors.keys() & self._whole.keys():  # touched again: the most recent now
                self._whole[key] = self._whole.pop(key)
            touched = [key for key, t in tensors.items() if self._is_cut(t)]  # (in the call's order: every rank's)
            if touched:
                for key in touched:
                    self._make_whole(tensors[key])
                    self._whole[key] = tensors[key]
                self._cut_again(keep=set(touched))
        return func(*args, **kwargs)


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


@functools.cache
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def give_back_freed_memory() -> None:
    """What was freed goes back to the system. glibc keeps freed blocks under its mmap threshold (which grows to
    32 MiB) in its heap, still resident: building a model of 16 MiB modules and cutting each, a rank's resident
    memory grew to 0.8 of the model while it held half of it. ``malloc_trim`` releases those pages."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def gather_chunks(chunk: torch.Tensor, shape: tuple[int, ...], world_size: int, group: Any) -> torch.Tensor:
    """The whole tensor of ``shape`` from every rank's dim-0 chunk (``torch.chunk``'s layout: chunks of equal rows
    but the last, and none for the ranks past the rows). A collective over ``group`` (gloo: on the host)."""
    rows = -(-shape[0] // world_size)
    cpu = chunk.cpu()
    if cpu.size(0) != rows:  # (the last rank's chunk may be short, or empty)
        cpu = torch.cat([cpu, cpu.new_zeros((rows - cpu.size(0), *shape[1:]))])
    whole = cpu.new_empty((rows * world_size, *shape[1:]))
    dist.all_gather_into_tensor(whole, cpu, group=group)  # (straight into the whole tensor)
    return whole[: shape[0]].to(chunk.device)


def whole_one_at_a_time(
    model: torch.nn.Module, chunks: dict[int, torch.Tensor], world_size: int, group: Any
) -> Iterator[torch.nn.Parameter]:
    """``model``'s parameters, each cut one (see :meth:`ShardedBuild.finish`) made whole just before it is
    yielded: an engine that partitions them its own way (ZeRO-3) holds one whole parameter at a time. A collective
    per cut parameter: every rank must iterate to the end."""
    for param in model.parameters():
        chunk = chunks.pop(id(param), None)
        if chunk is not None:
            param.data = gather_chunks(chunk, tuple(param.shape), world_size, group)
            del chunk
        yield param
        give_back_freed_memory()  # (the engine has partitioned it: the whole one is freed)
