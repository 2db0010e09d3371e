"""What transformers may conclude about the GPUs while :func:`~._without_gpus.without_gpus` hides them.

Two faults came of its asking then (``../shared/notes/gpu-verify.md``, N1):

- ``TrainingArguments(bf16=True)`` checks ``is_torch_bf16_gpu_available()`` unless ``use_cpu`` is set, and with the
  GPUs hidden the answer is no: it raised, so a bf16 Trainer objective was never described and its trial was planned
  from runtime estimates (the stand-in's device is ``meta``, so the usual ``use_cpu=trial.device.type == "cpu"`` is
  False; an objective that simply sets ``bf16=True`` does the same). While the GPUs are hidden, that check answers
  yes: a description only reads shapes, and the worker, which sees its GPU, asks for itself.
- transformers caches its hardware answers for the life of the process (``lru_cache``): an answer given while the
  GPUs were hidden (no bf16, no flash attention) would stay in a process whose forks are the workers (the pool host
  warms the objective up before it forks them). Whatever it cached meanwhile is forgotten when they are shown again.

transformers is not imported for this: an objective usually imports it itself, while it is described, so the check
is replaced as its module is imported (an import hook, for the time the GPUs are hidden), or at once if it already
is.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

_ARGUMENTS = "transformers.training_args"
_PROBES = "transformers.utils.import_utils"
_BF16_CHECK = "is_torch_bf16_gpu_available"


def _bf16_taken_as_available() -> bool:
    """Stands in for transformers' bf16 check while the GPUs are hidden (see the module's docstring)."""
    return True


@contextlib.contextmanager
def transformers_while_gpus_are_hidden() -> Iterator[None]:
    """For the time the GPUs are hidden: ``TrainingArguments`` takes bf16 as available, and whatever transformers
    caches about the hardware meanwhile is forgotten afterwards (see the module's docstring)."""
    answered_before = set(_answered_probes())
    replaced: dict[str, Any] = {}

    def take_bf16_as_available(module: ModuleType) -> None:
        replaced.setdefault("check", getattr(module, _BF16_CHECK, None))
        setattr(module, _BF16_CHECK, _bf16_taken_as_available)

    hook = _PatchedWhenImported(_ARGUMENTS, take_bf16_as_available)
    if _ARGUMENTS in sys.modules:
        take_bf16_as_available(sys.modules[_ARGUMENTS])
    else:
        sys.meta_path.insert(0, hook)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(hook)
        arguments = sys.modules.get(_ARGUMENTS)
        if arguments is not None and getattr(arguments, _BF16_CHECK, None) is _bf16_taken_as_available:
            setattr(arguments, _BF16_CHECK, replaced["check"])
        for name, probe in _answered_probes().items():
            if name not in answered_before:
                probe.cache_clear()


def _answered_probes() -> dict[str, Any]:
    """transformers' cached probes (``is_*_available``) that hold an answer, by name."""
    probes = sys.modules.get(_PROBES)
    if probes is None:
        return {}
    return {
        name: value
        for name, value in vars(probes).items()
        if hasattr(value, "cache_clear") and hasattr(value, "cache_info") and value.cache_info().currsize
    }


class _PatchedWhenImported(importlib.abc.MetaPathFinder):
    """Finds module ``name`` as Python would, and has ``patch`` applied to it right after it is executed."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self._name = name
        self._patch = patch

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self._name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and isinstance(spec.loader, importlib.abc.Loader):
            spec.loader = _ThenPatch(spec.loader, self._patch)
        return spec


class _ThenPatch(importlib.abc.Loader):
    """``loader``, with ``patch`` applied to the module it executes (anything else asked of it is ``loader``'s)."""

    def __init__(self, loader: importlib.abc.Loader, patch: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
