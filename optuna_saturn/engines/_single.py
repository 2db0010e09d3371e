from __future__ import annotations

import torch

from optuna_saturn.engines._base import Engine
from optuna_saturn.engines._blocks import enable_activation_checkpointing


class SingleEngine(Engine):
    """One process, one device: the model moves to the device; optionally with activation checkpointing."""

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.context.knobs.get("activation_checkpointing"):
            enable_activation_checkpointing(model)
        return model.to(self.context.device)
