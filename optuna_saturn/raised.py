"""An exception the user's objective raised in a worker, carried to the executor, where ``study.optimize``'s rules
apply to it (DESIGN decision 19): ``catch`` lists it, or its trial ends FAIL and the sweep stops and raises it.

The worker sends what the executor needs to decide without loading anything (the qualified names of the
exception's classes, so ``catch`` is matched by name) and, to raise the same exception, a cloudpickle of it,
over the sweep's private channel (the objective itself came to the worker the same way). An exception that
cannot be pickled, or whose class cannot be loaded here, is raised as :class:`ObjectiveFailed` with its text.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any


class ObjectiveFailed(RuntimeError):
    """The objective raised an exception in a worker that cannot be rebuilt in this process; its text says
    which (``type_names``: its classes, most derived first)."""

    def __init__(self, text: str, type_names: Sequence[str] = ()) -> None:
        super().__init__(text)
        self.type_names = list(type_names)


def record(exc: BaseException) -> dict[str, Any]:
    """What a worker sends of ``exc``."""
    import cloudpickle

    try:
        pickled: str | None = base64.b64encode(cloudpickle.dumps(exc)).decode("ascii")
    except Exception:
        pickled = None
    return {
        "classes": [_name(c) for c in type(exc).__mro__],
        "text": f"{type(exc).__name__}: {exc}",
        "pickled": pickled,
    }


def caught(raised: dict[str, Any], catch: Sequence[type[BaseException]]) -> bool:
    """Whether ``catch`` lists the exception (one of its classes); ``KeyboardInterrupt`` and ``SystemExit`` are
    never caught, as ``study.optimize`` never catches them."""
    classes = set(raised.get("classes") or ())
    if classes & {"builtins.KeyboardInterrupt", "builtins.SystemExit"}:
        return False
    return any(_name(c) in classes for c in catch)


def rebuilt(raised: dict[str, Any]) -> BaseException:
    """The exception the worker raised, as an object of this process (see the module's docstring)."""
    import cloudpickle

    if raised.get("pickled"):
        try:
            exc = cloudpickle.loads(base64.b64decode(raised["pickled"]))
            if isinstance(exc, BaseException):
                return exc
        except Exception:
            pass
    return ObjectiveFailed(str(raised.get("text", "the objective raised an exception")), raised.get("classes") or ())


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
