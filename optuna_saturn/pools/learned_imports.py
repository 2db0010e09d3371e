"""What a description imported that the describer had not, imported by the describer for the next ones.

Each description runs in a fork of the describer, so what the objective imports lazily (a Hugging Face model
class the first time it is touched: ``transformers.models.gpt2.modeling_gpt2`` and its like, 1.3 s on these
machines) is imported again in every fork, and lost with it: eight enqueued trials of the example took 10 s to
describe instead of 2. The fork lists the *library* modules it imported (under the interpreter's standard library
or site-packages: not the modules of the user's script or project folder), and the describer imports them after
the fork ended, with the GPUs hidden as the description had them, so later forks start with them. That is the
import of installed packages only: the describer still never calls the user's objective.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import site
import sys
import sysconfig
import threading
from collections.abc import Iterable


def library_modules_imported_since(before: Iterable[str]) -> list[str]:
    """Modules in ``sys.modules`` now and not in ``before`` whose files are the interpreter's libraries."""
    before = set(before)
    roots = _library_roots()
    found = []
    for name, module in list(sys.modules.items()):
        if name in before or module is None:
            continue
        path = getattr(module, "__file__", None)
        if path and os.path.realpath(path).startswith(roots):
            found.append(name)
    return sorted(found)  # (parents before their submodules)


def write(path: str, names: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(names, f)


def import_what_was_written(path: str) -> list[str]:
    """Import the modules a fork wrote to ``path`` (and remove it); the names of those that would not import
    alone are skipped. Returns what was imported."""
    try:
        with open(path, encoding="utf-8") as f:
            names = json.load(f) if os.fstat(f.fileno()).st_size else []
    except (OSError, ValueError):
        names = []
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    from optuna_saturn.profiler._without_gpus import without_gpus

    threads = threading.active_count()
    imported = []
    with without_gpus():  # (as in the description: a library that looks for GPUs at import finds none)
        for name in names:
            if name in sys.modules:
                continue
            try:
                importlib.import_module(name)
            except Exception:  # (one that imports only in its package's own order: the forks import it)
                continue
            imported.append(name)
    if threading.active_count() > threads:  # (forks of a process with threads may deadlock: say so in its log)
        print(f"optuna-saturn: importing {len(imported)} module(s) started a thread in the describer.", flush=True)
    return imported


def _library_roots() -> tuple[str, ...]:
    paths = {sysconfig.get_paths()[key] for key in ("purelib", "platlib", "stdlib", "platstdlib")}
    paths.update(site.getsitepackages())
    return tuple(os.path.join(os.path.realpath(p), "") for p in paths if p)
