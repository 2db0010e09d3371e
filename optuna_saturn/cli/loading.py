"""Loading what the command line names from the user's code: ``path/to/file.py:function`` or
``package.module:function``, importable again by the worker processes (the objective; a sampler's or pruner's
factory)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from optuna_saturn.cli.app import fail


def load_objective(spec: str) -> Callable[..., Any]:
    """``path/to/file.py:function`` or ``package.module:function``, importable again by worker processes.

    A file is imported under its own module name with its folder put first on ``sys.path``; the executor passes
    ``sys.path`` to the workers, so they import the same module by name. Its ``__main__`` block does not run.
    """
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        fail(f"Cannot read the objective {spec!r}: give it as path/to/file.py:function or module:function.")
    if target.endswith(".py") or os.sep in target or "/" in target:
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            fail(f"Objective file {target!r} does not exist (looked for {path}).")
        module_name = path.stem
        if not module_name.isidentifier():
            fail(
                f"Objective file {path.name!r} cannot be imported by workers: rename it to a valid Python module "
                "name (letters, digits, underscores)."
            )
        sys.path.insert(0, str(path.parent))
        module = _import(module_name, spec)
        loaded_from = Path(getattr(module, "__file__", "") or "").resolve()
        if loaded_from != path:
            fail(
                f"The module name {module_name!r} of {str(path)!r} is taken by {str(loaded_from)!r}; rename "
                "your file so that workers import the right one."
            )
    else:
        if os.getcwd() not in sys.path:  # like `python -m`: modules in the current folder are found
            sys.path.insert(0, os.getcwd())
        module = _import(target, spec)
    function = module
    for part in name.split("."):
        function = getattr(function, part, None)
        if function is None:
            found = sorted(
                k
                for k, v in vars(module).items()
                if callable(v) and getattr(v, "__module__", "") == module.__name__ and not k.startswith("_")
            )
            fail(f"No function {name!r} in {target!r}. Functions defined there: {', '.join(found) or 'none'}.")
    if not callable(function):
        fail(f"{spec!r} is not a function but a {type(function).__name__}.")
    return cast(Callable[..., Any], function)  # (callable: checked above)


def _import(module_name: str, spec: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == module_name or module_name.startswith(missing + "."):  # (it, or a package above it)
            fail(
                f"Cannot import module {module_name!r} for {spec!r} (no module named {missing!r}): run from the "
                "folder that contains it, put it on PYTHONPATH, or give the objective as path/to/file.py:function."
            )
        fail(
            f"Importing {module_name!r} for {spec!r} failed: it imports {missing!r}, which is not installed in this "
            f"environment ({exc}). Install it here (pip install ...), or run where it is installed."
        )
