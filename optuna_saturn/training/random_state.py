"""The random generators a training run draws from, captured and set back as one value.

Used where a run must draw exactly as another did: the ranks of a sharded loader copy rank 0's states at each
pass (:mod:`optuna_saturn.training.sharding`), a checkpoint keeps them (:mod:`optuna_saturn.training.checkpoint`),
and a loader resumed mid-pass replays its pass's start (:mod:`optuna_saturn.training.loader_positions`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch


def capture(generators: Sequence[torch.Generator] = (), *, cuda: bool = False) -> dict[str, Any]:
    """torch's, Python's and NumPy's global states, ``generators``' own, and (``cuda``) this device's CUDA one."""
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "random": random.getstate(),
        "generators": [g.get_state() for g in generators],
    }
    if cuda and torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()
    try:
        import numpy

        states["numpy"] = numpy.random.get_state()
    except ImportError:
        pass
    return states


def restore(states: dict[str, Any], generators: Sequence[torch.Generator] = ()) -> None:
    """Set back what :func:`capture` took (``generators`` in the same order)."""
    torch.set_rng_state(states["torch"])
    random.setstate(states["random"])
    for generator, state in zip(generators, states.get("generators", [])):
        generator.set_state(state)
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])
    if "numpy" in states:
        import numpy

        numpy.random.set_state(states["numpy"])
