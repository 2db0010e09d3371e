"""Mutations of the GPU contracts: each one undoes one fix, and the tests named for it must then fail.

A fix that can be reverted with every test green is not guarded (``../shared/notes/gpu-verify.md`` found two).
Each area's module lists its mutations; ``run.py`` applies them one at a time to a copy of the repository and runs
their tests there. A mutation is a text replacement, not a line-numbered patch, so that it survives edits around
it: its ``old`` text must occur exactly once in its file (``run.py --check`` says where it does not).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutation:
    """One fix undone: in ``path``, the one occurrence of ``old`` becomes ``new``; then the tests in ``tests`` run
    in turn (each a pytest node id, or pytest arguments such as ``"tests/x.py -k name"``), and one must fail."""

    name: str
    contract: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
