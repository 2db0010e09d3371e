"""The precision of a Lightning trial: float32, or autocast to bfloat16 or float16, whatever the trial's strategy
(the strategy never changes it), with clipping and the optimizer's step done the way every strategy takes them."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.utilities import GradClipAlgorithmType

from optuna_saturn.engines._base import loss_scaler_mismatch

if TYPE_CHECKING:
    from optuna_saturn.training.training_trial import TrainingTrial


def precision_plugin(strategy: Strategy, trial: TrainingTrial, precision: Any) -> Precision:
    """The Trainer's ``precision``, applied whatever the trial's strategy (the strategy never changes it):
    float32, or autocast to bfloat16 or float16 (with Lightning's loss scaler, under strategies that take one).
    ``strategy`` is the Lightning strategy that runs ``trial``'s (its ``model`` is the prepared one)."""
    mixed = {"bf16-mixed": "bf16-mixed", "bf16": "bf16-mixed", "16-mixed": "16-mixed", "16": "16-mixed", 16: "16-mixed"}
    if precision not in mixed:
        return _ModelPrecision(strategy)
    if mixed[precision] == "16-mixed" and not trial._engine.takes_a_loss_scaler:
        raise loss_scaler_mismatch(trial.strategy.name)
    return _ModelMixedPrecision(strategy, mixed[precision], trial.device.type)


class _PreparedModelsParameters(Precision):
    """``gradient_clip_val`` clips the prepared model's gradients. Lightning clips the optimizer's parameters,
    which under ZeRO are the engine's flat partitions (their ``.grad`` is empty: nothing would be clipped); the
    model's parameters are the ones the engine routes clipping for (see :mod:`optuna_saturn.engines._clipping`).
    And the optimizer's step comes after the closure, not inside it: DeepSpeed's step takes no closure."""

    _strategy: Strategy

    def main_params(self, optimizer: Any) -> Any:
        assert self._strategy.model is not None
        return self._strategy.model.parameters()

    # (Lightning's own Precision.optimizer_step takes the model and the closure, unlike Fabric's it overrides)
    def optimizer_step(self, optimizer: Any, model: Any, closure: Any, **kwargs: Any) -> Any:  # type: ignore[override]  # see above
        """The closure (forward, backward, clipping) first, then the step: DeepSpeed's step takes no closure.
        An optimizer that evaluates the closure several times (LBFGS) gets it, as in Lightning."""
        closure = functools.partial(self._wrap_closure, model, optimizer, closure)
        if isinstance(getattr(optimizer, "optimizer", optimizer), torch.optim.LBFGS):
            return optimizer.step(closure=closure, **kwargs)
        result = closure()
        optimizer.step(**kwargs)
        return result


class _ModelPrecision(_PreparedModelsParameters, Precision):
    """Float32."""

    def __init__(self, strategy: Strategy) -> None:
        super().__init__()
        self._strategy = strategy


class _ModelMixedPrecision(_PreparedModelsParameters, MixedPrecision):
    """Autocast to bfloat16 or float16 around each step's forward pass (Lightning's ``MixedPrecision``); under fp16
    Lightning's loss scaler runs the step, as it does in one process."""

    def __init__(self, strategy: Strategy, precision: Any, device: str) -> None:
        super().__init__(precision, device)
        self._strategy = strategy

    def optimizer_step(self, optimizer: Any, model: Any, closure: Any, **kwargs: Any) -> Any:  # type: ignore[override]  # as above
        if self.scaler is not None:
            return MixedPrecision.optimizer_step(self, optimizer, model, closure, **kwargs)
        return super().optimizer_step(optimizer, model, closure, **kwargs)

    def clip_gradients(self, optimizer: Any, clip_val: Any = 0.0, gradient_clip_algorithm: Any = None) -> None:
        """bf16 needs no unscaling: clipped as in float32 (Lightning's check, for optimizers that unscale in
        their step, would refuse the sharding engines' optimizers, which declare that only to meet a fp16
        scaler; fp16 never reaches them: see ``precision_plugin``)."""
        algorithm = gradient_clip_algorithm or GradClipAlgorithmType.NORM
        if self.scaler is not None:
            MixedPrecision.clip_gradients(self, optimizer, clip_val, algorithm)
        else:
            Precision.clip_gradients(self, optimizer, clip_val, algorithm)
