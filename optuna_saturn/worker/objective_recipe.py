"""How a worker process finds the user's objective function.

Workers are fresh interpreters started by a launcher, so the objective must be found again there. A module-level
function is found by its import path (a function in the script that is running as ``__main__`` by its file, run
under another name so that its ``if __name__ == "__main__":`` block does not start a second sweep). Anything else
(a lambda, a closure, a notebook function) is serialised by value with cloudpickle into the sweep's private folder.
One that cannot be pickled (it holds a lock, an open file, a connection) is *inherited*: the pool's processes that
are forks of this one (its host, its workers, the describer) find it in their memory, as this process left it.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import os
import runpy
import sys
from collections.abc import Callable
from typing import Any

import cloudpickle


def _lookup(namespace: Any, qualname: str) -> Any:
    for part in qualname.split("."):
        namespace = getattr(namespace, part) if not isinstance(namespace, dict) else namespace[part]
    return namespace


def _named(namespace: Any, qualname: str, objective: Any) -> bool:
    """Whether ``qualname`` in ``namespace`` is ``objective`` itself."""
    try:
        return _lookup(namespace, qualname) is objective
    except (AttributeError, KeyError):
        return False


def describe_objective(objective: Callable[..., Any], private_folder: str) -> dict:
    """A JSON-able recipe that lets a worker get ``objective`` back."""
    if not callable(objective):
        raise TypeError(f"objective must be callable, got {type(objective).__name__}.")
    module = getattr(objective, "__module__", None)
    qualname = getattr(objective, "__qualname__", "")
    recipe: dict = {"sys_path": [os.path.abspath(p) if p else os.getcwd() for p in sys.path]}
    # (by name only where the name finds it: an instance with __call__ has its class's module, but no name)
    if module and qualname and "<" not in qualname:
        if module == "__main__":
            main_file = getattr(sys.modules["__main__"], "__file__", None)
            if main_file and os.path.exists(main_file) and _named(sys.modules["__main__"], qualname, objective):
                return {**recipe, "kind": "file", "path": os.path.abspath(main_file), "qualname": qualname}
        else:
            try:
                if _named(importlib.import_module(module), qualname, objective):
                    return {**recipe, "kind": "module", "module": module, "qualname": qualname}
            except ImportError:
                pass
    path = os.path.join(private_folder, "objective.pkl")
    try:
        with open(path, "wb") as f:
            cloudpickle.dump(objective, f)
    except Exception as exc:  # (it holds what cannot be pickled: a fork of this process finds it in memory)
        os.unlink(path)
        key = f"{os.getpid()}-{id(objective)}"
        _INHERITED[key] = objective
        why = f"{type(exc).__name__}: {exc}"
        return {**recipe, "kind": "inherited", "key": key, "why": why, "qualname": qualname or repr(objective)}
    return {**recipe, "kind": "pickle", "path": path}


#: Objectives that could not be pickled, for the forks of this process to find (see the module's docstring).
_INHERITED: dict[str, Callable[..., Any]] = {}


class NotInherited(RuntimeError):
    """The objective could not be pickled, and this process is not a fork of the one that holds it."""


def load_objective(recipe: dict) -> Callable[..., Any]:
    """The worker side of :func:`describe_objective`."""
    for entry in reversed(recipe.get("sys_path", [])):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    kind = recipe["kind"]
    objective: Callable[..., Any]  # (what describe_objective was given: it checked that it is callable)
    if kind == "module":
        objective = _lookup(importlib.import_module(recipe["module"]), recipe["qualname"])
    elif kind == "file" and "origin" in recipe:  # (a copy: run as the script it copies, for its __file__)
        with open(recipe["path"], "rb") as f:
            code = compile(f.read(), recipe["origin"], "exec")
        namespace: dict[str, Any] = {
            "__name__": "__saturn_main__",
            "__file__": recipe["origin"],
            "__builtins__": __builtins__,
        }
        exec(code, namespace)
        objective = _lookup(namespace, recipe["qualname"])
    elif kind == "file":
        namespace = runpy.run_path(recipe["path"], run_name="__saturn_main__")
        objective = _lookup(namespace, recipe["qualname"])
    elif kind == "inherited":
        if recipe["key"] not in _INHERITED:
            raise NotInherited(
                f"The objective {recipe['qualname']} cannot be pickled ({recipe['why']}), so it runs only in "
                "processes forked from the executor's, and this one is not (a fresh interpreter: the executor had "
                "initialised CUDA or ran other threads, or the pool is on other machines). Define the objective at "
                "the top level of a module, or create what it cannot pickle (a lock, a file, a connection) inside it."
            )
        objective = _INHERITED[recipe["key"]]
    else:
        with open(recipe["path"], "rb") as f:
            objective = cloudpickle.load(f)
    return objective


def portable(recipe: dict) -> dict:
    """``recipe`` for a worker on another machine, which may not see this one's files: a script or pickle it
    names travels inside it (the objective's imports must still be installed there)."""
    if recipe.get("kind") == "inherited":  # (no fork of this process runs on another machine)
        load_objective({**recipe, "key": ""})
    if recipe.get("kind") not in ("file", "pickle") or "content" in recipe:
        return recipe
    with open(recipe["path"], "rb") as f:
        return {**recipe, "content": base64.b64encode(f.read()).decode("ascii")}


def localized(recipe: dict, folder: str) -> dict:
    """The worker side of :func:`portable`: the file it carries, written into this machine's private ``folder``
    (once per content), and the recipe pointing there. Always the copy, even where the original path exists here
    with the same bytes: comparing it, then running it later, would run whatever it holds by then. A script
    still runs with its original ``__file__`` (``origin``)."""
    if "content" not in recipe:
        return recipe
    content = base64.b64decode(recipe["content"])
    plain = {k: v for k, v in recipe.items() if k != "content"}
    name = hashlib.sha256(content).hexdigest()[:16] + os.path.splitext(recipe["path"])[1]
    path = os.path.join(folder, name)
    if not os.path.exists(path):  # (the folder is this user's, 0700: no one else writes into it)
        partial = f"{path}.{os.getpid()}.partial"
        with open(partial, "wb") as f:
            f.write(content)
        os.replace(partial, path)
    return plain | {"path": path, "origin": recipe["path"]}
