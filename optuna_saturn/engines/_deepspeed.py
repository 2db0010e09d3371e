from __future__ import annotations

import copy
import os
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import torch

from optuna_saturn.engines import _clipping
from optuna_saturn.engines._base import Engine, StrategyMismatch, WorkerContext, refuse_a_loss_scaler
from optuna_saturn.engines._deepspeed_buckets import device_memory_of, size_buckets
from optuna_saturn.engines._offload_optimizer import host_optimizer
from optuna_saturn.strategy.builtin_engines import DeepSpeedTraits

#: Optimizers whose update of each element depends only on that element's gradient and state. ZeRO flattens each
#: parameter group into one vector per rank, so only these compute the same update as in one process.
ELEMENTWISE_OPTIMIZERS = frozenset(
    {
        "SGD",
        "Adam",
        "AdamW",
        "Adamax",
        "Adagrad",
        "Adadelta",
        "RMSprop",
        "NAdam",
        "RAdam",
        "ASGD",
        "Rprop",
        "DeepSpeedCPUAdam",
        "FusedAdam",
        "DeepSpeedCPUAdagrad",
        "FusedLion",
        "DeepSpeedCPULion",
    }
)


class _EngineOptimizer(torch.optim.Optimizer):
    """What ``prepare`` returns for the optimizer under DeepSpeed. It is a ``torch.optim.Optimizer`` (LR schedulers
    made after ``prepare`` accept it) whose ``param_groups`` are the user's own: the ZeRO optimizer steps the user's
    optimizer over its flat partitions, so a scheduler made before or after ``prepare`` sets the learning rate that
    is used. ``step()`` is the engine's step (which also zeroes gradients), so the ordinary
    ``zero_grad()`` / ``step()`` loop stays unchanged."""

    def __init__(self, engine: Any, defaults: dict, strategy: str) -> None:  # no super().__init__: see above
        self.engine = engine
        self.engine_strategy = strategy
        self.optimizer = engine.optimizer  # the ZeRO stage's own optimizer
        self.defaults = defaults
        self._optimizer_step_pre_hooks: OrderedDict = OrderedDict()
        self._optimizer_step_post_hooks: OrderedDict = OrderedDict()
        self._optimizer_state_dict_pre_hooks: OrderedDict = OrderedDict()
        self._optimizer_state_dict_post_hooks: OrderedDict = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks: OrderedDict = OrderedDict()
        self._optimizer_load_state_dict_post_hooks: OrderedDict = OrderedDict()

    # (torch types param_groups and state as attributes: here they are read from the ZeRO optimizer)
    @property
    def param_groups(self) -> list[dict]:  # type: ignore[override]  # an attribute in torch, see above
        groups: list[dict] = self.optimizer.param_groups  # (deepspeed has no types)
        return groups

    @property
    def state(self) -> Any:  # type: ignore[override]  # an attribute in torch, see above
        return self.optimizer.state

    _step_supports_amp_scaling = True  # (a scaler then says so before the step: see refuse_a_loss_scaler)

    def step(self, closure: Any = None) -> None:  # type: ignore[override]  # torch's overloads return the loss
        refuse_a_loss_scaler(self, self.engine_strategy)
        if closure is not None:
            raise ValueError("DeepSpeed's optimizer step takes no closure; compute the loss before optimizer.step().")
        self.engine.step()
        self.optimizer.clip_grad = 0.0  # a clip_grad_norm_ call clips the step that follows it, only that one

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass  # the engine zeroes gradients in step()

    def state_dict(self) -> dict:
        state: dict = self.optimizer.state_dict()  # (deepspeed has no types)
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.optimizer).__name__})"


class DeepSpeedEngine(Engine):
    """DeepSpeed ZeRO (stage and offload from the strategy's ``launcher_config``), through
    ``deepspeed.initialize`` so it is real on CPU too."""

    @property
    def stage(self) -> int:
        return int(self.context.launcher_config.get("zero_optimization", {}).get("stage", 0))

    counts_micro_batches = True
    takes_a_loss_scaler = False
    checkpoint_format = DeepSpeedTraits.checkpoint_format  # its own: the ZeRO partitions and its engine's counters

    def __init__(self, context: WorkerContext) -> None:
        super().__init__(context)
        self._engines: list[Any] = []  # the DeepSpeed engines this run made: destroyed when it ends

    def release(self) -> None:
        """DeepSpeed's engine holds its ZeRO partitions, optimizer state and gradient buckets through hooks on the
        model: ``destroy()`` unhooks them, so the run's memory is freed before the next run in this process."""
        engines, self._engines = self._engines, []
        for engine in engines:
            engine.destroy()
        super().release()

    @property
    def shards_parameters(self) -> bool:
        return self.stage >= 3

    def user_module(self, model: torch.nn.Module) -> torch.nn.Module:
        import deepspeed

        return model.module if isinstance(model, deepspeed.DeepSpeedEngine) else model

    def prepare_model_and_optimizer(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
    ) -> tuple[torch.nn.Module, Any]:
        import deepspeed

        if optimizer is not None:
            self._check_elementwise(optimizer)
        if self.context.knobs.get("activation_checkpointing"):
            from optuna_saturn.engines._blocks import enable_activation_checkpointing

            enable_activation_checkpointing(model)
        config = copy.deepcopy(self.context.launcher_config)
        # The trial's own loop decides the batch; these only need to be consistent for DeepSpeed's bookkeeping,
        # except the accumulation, which DeepSpeed applies itself (loss scaling, optimizer step at the boundary).
        config.setdefault("train_micro_batch_size_per_gpu", 1)
        config["gradient_accumulation_steps"] = self.context.gradient_accumulation
        config["train_batch_size"] = (
            config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * self.context.world_size
        )
        config.setdefault("zero_allow_untested_optimizer", True)
        config.setdefault("zero_force_ds_cpu_optimizer", False)  # (any optimizer may be offloaded: see below)
        config.setdefault("steps_per_print", 10**9)
        config["gradient_clipping"] = 0.0  # clipping is the user's call: clip_grad_norm_ sets it per step
        if "zero_optimization" in config:
            size_buckets(
                model,
                config["zero_optimization"],
                world_size=self.context.world_size,
                device_memory=device_memory_of(self.context.device),
            )
        if optimizer is not None:  # under offload on a GPU, DeepSpeedCPUAdam steps for Adam(W): same values, 9x faster
            optimizer = host_optimizer(optimizer, config.get("zero_optimization", {}), self.context.device)
        model = self._partitioned(model, config) if self.shards_parameters else model.to(self.context.device)
        engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=config, dist_init_required=False
        )
        self._engines.append(engine)
        if engine.device != self.context.device:  # (it places the model by LOCAL_RANK: see optuna_saturn.worker.gpu)
            raise RuntimeError(
                f"DeepSpeed placed the model on {engine.device}, not on this worker's {self.context.device} "
                f"(LOCAL_RANK={os.environ.get('LOCAL_RANK')}, CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES')}): it would run on another trial's GPU."
            )
        _clipping.register(self, engine, list(engine.module.parameters()))
        return engine, (
            None if optimizer is None else _EngineOptimizer(engine, optimizer.defaults, self.context.strategy)
        )

    def _partitioned(self, model: torch.nn.Module, config: dict) -> torch.nn.Module:
        """ZeRO-3: partition the parameters now, each moved to the device alone and cut to this rank's part
        (``zero.Init`` on the built model), so a model that fits the devices only when sharded never sits whole on
        one; ``initialize`` then leaves the placement alone. Buffers are small: they go to the device whole. Every
        rank starts from rank 0's values (they are broadcast), as in one process. Parameters cut while the model was
        built (:mod:`optuna_saturn.engines._sharded_build`) are made whole one at a time, as ``Init`` reaches each:
        no rank's host memory holds the whole model either."""
        import deepspeed

        from optuna_saturn.engines._sharded_build import whole_one_at_a_time

        deepspeed.init_distributed(dist_init_required=False)  # (on the job's process group: Init needs its size)
        chunks = self.built_chunks(model)
        if chunks:  # Init partitions model.parameters() as it iterates them: each is whole just before its turn
            one_by_one = whole_one_at_a_time(model, chunks, self.context.world_size, self.context.control_group)
            model.parameters = lambda recurse=True: (  # type: ignore[method-assign]  # for Init's one call only
                vars(model).pop("parameters") and one_by_one
            )
        deepspeed.zero.Init(module=model, config_dict_or_path=config)
        device = self.context.device
        for module in model.modules():
            for name, buffer in module.named_buffers(recurse=False):
                module._buffers[name] = buffer.to(device)
        return model

    def _check_elementwise(self, optimizer: torch.optim.Optimizer) -> None:
        name = type(optimizer).__name__
        if name not in ELEMENTWISE_OPTIMIZERS:
            raise StrategyMismatch(
                f"'{self.context.strategy}' (DeepSpeed ZeRO) flattens each parameter group into one vector per "
                f"rank, so an optimizer that looks at each parameter's shape computes another update there than in "
                f"one process. {name} is not one optuna-saturn knows to be element-wise "
                f"({', '.join(sorted(ELEMENTWISE_OPTIMIZERS))}). The planner leaves this strategy out for this "
                "trial; to silence it, leave DeepSpeed strategies out of the sweep (strategies=[...])."
            )

    def backward(
        self, loss: torch.Tensor, model: torch.nn.Module | None, *, weight: float = 1.0, last_micro_batch: bool = True
    ) -> None:
        accumulation = self.context.gradient_accumulation
        weight = weight * accumulation  # DeepSpeed divides by gradient_accumulation_steps itself
        engine = _engine_of(model)
        engine.backward(loss * weight if weight != 1.0 else loss)
        if not last_micro_batch:
            # DeepSpeed counts micro-batches in step(): before the boundary it only advances the count. The
            # user's optimizer.step() after the last micro-batch is the step at the boundary.
            engine.step()

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.shards_parameters:
            self.refuse_unwrap()
        return getattr(model, "module", model)

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, Any]:
        if not self.shards_parameters:
            return super().full_state_dict(model)
        state = _engine_of(
            model
        )._zero3_consolidated_16bit_state_dict()  # collective; the parameters' own dtype, on rank 0
        return dict(state) if self.context.rank == 0 and state else {}

    def clip_grad_norm(
        self,
        model: torch.nn.Module,
        parameters: Iterable[torch.nn.Parameter],
        max_norm: float,
        norm_type: float,
        **kwargs: Any,
    ) -> torch.Tensor:
        """ZeRO clips inside its step, over every partition: set the limit for the step that follows, and
        return the total norm (before clipping) as torch does."""
        if norm_type != 2.0:
            raise ValueError(
                f"DeepSpeed ZeRO clips by the L2 norm only; use norm_type=2 (got {norm_type}), or leave DeepSpeed "
                "strategies out of this sweep."
            )
        engine = _engine_of(model)
        if len({id(p) for p in parameters}) != len(list(engine.module.parameters())):
            raise ValueError(
                "DeepSpeed ZeRO clips the whole model's gradients together; pass all of them: "
                "clip_grad_norm_(model.parameters(), max_norm)."
            )
        zero = engine.optimizer
        if hasattr(zero, "scaled_global_norm"):  # stages 1 and 2
            total = zero.scaled_global_norm()
        else:  # stage 3
            from deepspeed.runtime.utils import combine_grad_norm_groups

            total = combine_grad_norm_groups(zero._get_norm_groups())
        zero.clip_grad = max_norm
        # on the gradients' device, as torch returns it: no host sync each step (the user's .item() may sync)
        norm: torch.Tensor = torch.as_tensor(total, dtype=torch.float32).detach() / zero.loss_scale
        return norm


def _engine_of(model: torch.nn.Module | None) -> Any:
    """The DeepSpeedEngine that ``prepare`` made of the user's model (deepspeed has no types)."""
    if model is None:
        raise ValueError("DeepSpeed trains through the model trial.prepare() returned: prepare the model first.")
    return model
