"""A pool made from the command line's options: ``--runner NAME`` and ``--pool-option KEY=VALUE`` (repeated), each
option a keyword of the kind's class (``--runner slurm --pool-option nodes=2 --pool-option partition=gpu`` is
``SlurmPool(nodes=2, partition="gpu")``). Why generic: the command line names no pool kind and grows no flag per
kind's option; a kind's own constructor checks its values, and a plug-in kind gets its options the same way."""

from __future__ import annotations

import inspect
import shlex
from collections.abc import Sequence
from typing import Any

from optuna_saturn.pools.kinds import PoolKind
from optuna_saturn.pools.registry import kinds


def pool_from_options(runner: str, options: Sequence[str]) -> PoolKind:
    """The pool kind ``runner`` names, made with ``options`` (``KEY=VALUE`` each): a whole number is an int, an
    option whose default is a sequence takes its value split as a shell splits it, anything else is a string.
    Raises ValueError naming the options the kind takes."""
    known = kinds()
    if runner not in known:
        raise ValueError(f"--runner must be one of {', '.join(sorted(known))}, got {runner!r}.")
    kind = known[runner].load() if hasattr(known[runner], "load") else known[runner]
    accepted = {name: p for name, p in inspect.signature(kind).parameters.items() if p.kind is p.KEYWORD_ONLY}
    keywords: dict[str, Any] = {}
    for option in options:
        key, equals, value = option.partition("=")
        key = key.strip().replace("-", "_")
        if not equals or not key:
            raise ValueError(f"--pool-option takes KEY=VALUE, got {option!r}.")
        if key not in accepted:
            takes = ", ".join(sorted(accepted)) or "no option"
            raise ValueError(f"--runner {runner}'s pool takes no option {key!r}; it takes {takes}.")
        default = accepted[key].default
        keywords[key] = (
            shlex.split(value)
            if isinstance(default, (list, tuple))
            else int(value)
            if value.strip().isdigit()
            else value
        )
    made = kind(**keywords)
    if not isinstance(made, PoolKind):
        raise TypeError(f"The pool kind {runner!r} ({kind}) does not implement optuna_saturn.pools.PoolKind.")
    return made
