from __future__ import annotations

from optuna_saturn.engines._base import Engine


class SingleEngine(Engine):
    """One process, one device: the model moves to the device and nothing else changes."""
