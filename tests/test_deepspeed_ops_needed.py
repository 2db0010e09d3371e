"""DeepSpeed's compiled ops that a sweep's strategies need are built before its pool (issue 46, the shared node):
which ops, for which device kind and strategy set; and under ZeRO-Offload on a GPU, ``DeepSpeedCPUAdam`` (whose op
that is) steps for the user's Adam or AdamW. The CUDA build itself cannot run here: its contract is tested."""

from __future__ import annotations

from pathlib import Path

import gpu_objectives
import optuna
import pytest
import torch
from optuna.trial import TrialState

from optuna_saturn import SaturnExecutor
from optuna_saturn.engines import _deepspeed
from optuna_saturn.engines._base import WorkerContext
from optuna_saturn.engines._offload_optimizer import host_optimizer, why_not_swapped
from optuna_saturn.pools import deepspeed_ops
from optuna_saturn.pools.deepspeed_ops import missing
from optuna_saturn.strategy import load_strategies

GPU = torch.device("cuda", 0)  # (only a name here: nothing runs on it)
OFFLOAD = {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True}}


def _configs(*names: str) -> list[dict]:
    shipped = load_strategies()
    return [dict(shipped[name].launcher_config) for name in names]


def test_the_ops_built_first_are_those_the_sweeps_strategies_need_on_its_devices(tmp_path):
    every_zero = _configs("zero1", "zero2", "zero3", "zero3-offload")
    assert missing("cpu", tmp_path, every_zero) == ["ShareMemCommBuilder"]  # (CPU devices: no optimizer swap)
    assert missing("cuda", tmp_path, _configs("zero1", "zero2", "zero3")) == []  # the user's optimizer: no op
    assert missing("cuda", tmp_path, every_zero) == ["CPUAdamBuilder"]
    named = {"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    assert missing("cuda", tmp_path, [named]) == ["FusedAdamBuilder"]  # DeepSpeed makes FusedAdam for it
    offloaded = {**named, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    assert missing("cuda", tmp_path, [offloaded]) == ["CPUAdamBuilder"]  # ...or DeepSpeedCPUAdam, offloaded
    as_torch = {**named, "optimizer": {"type": "Adam", "params": {"torch_adam": True}}}
    assert missing("cuda", tmp_path, [as_torch]) == []
    (tmp_path / "cpu_adam").mkdir()
    (tmp_path / "cpu_adam" / "cpu_adam.so").write_bytes(b"")
    assert missing("cuda", tmp_path, every_zero) == []  # built once, kept for later sweeps


@pytest.fixture
def built_cpu_adam(tmp_path, monkeypatch):
    """The op in the extensions folder (an empty library), and a stand-in DeepSpeedCPUAdam that records how it was
    made (the real one loads the library)."""
    import deepspeed.ops.adam

    (tmp_path / "cpu_adam").mkdir()
    (tmp_path / "cpu_adam" / "cpu_adam.so").write_bytes(b"")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))

    class DeepSpeedCPUAdam(torch.optim.Optimizer):
        def __init__(self, params, *, lr, betas, eps, weight_decay, adamw_mode):
            super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=True))
            self.adamw_mode = adamw_mode

    monkeypatch.setattr(deepspeed.ops.adam, "DeepSpeedCPUAdam", DeepSpeedCPUAdam)
    return DeepSpeedCPUAdam


def test_offload_on_a_gpu_steps_deepspeeds_cpu_adam_over_the_users_own_groups(built_cpu_adam):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    groups = [{"params": model[0].parameters(), "weight_decay": 0.1}, {"params": model[1].parameters()}]
    for cls, adamw in ((torch.optim.AdamW, True), (torch.optim.Adam, False)):
        user = cls(groups if cls is torch.optim.AdamW else model.parameters(), lr=3e-3, betas=(0.8, 0.9))
        swapped = host_optimizer(user, OFFLOAD, GPU)
        assert type(swapped) is built_cpu_adam and swapped.adamw_mode is adamw
        assert all(a is b for a, b in zip(swapped.param_groups, user.param_groups))  # the same dicts
        for group in user.param_groups:  # (as a scheduler made on the user's optimizer sets it)
            group["lr"] = 1.5e-3
        assert [g["lr"] for g in swapped.param_groups] == [1.5e-3] * len(user.param_groups)
        assert swapped.param_groups[0]["betas"] == (0.8, 0.9)
    assert host_optimizer(torch.optim.AdamW(groups), OFFLOAD, GPU).param_groups[0]["weight_decay"] == 0.1


def test_the_users_optimizer_steps_where_deepspeeds_would_not_compute_the_same(built_cpu_adam, tmp_path, monkeypatch):
    params = list(torch.nn.Linear(4, 1).parameters())

    class MyAdam(torch.optim.Adam):
        pass

    stepped = torch.optim.Adam(params)
    params[0].grad = torch.zeros_like(params[0])
    stepped.step()
    reasons = {
        "cpu device": why_not_swapped(torch.optim.Adam(params), OFFLOAD, torch.device("cpu")),
        "no offload": why_not_swapped(torch.optim.Adam(params), {"stage": 3}, GPU),
        "SGD": why_not_swapped(torch.optim.SGD(params, lr=0.1), OFFLOAD, GPU),
        "subclass": why_not_swapped(MyAdam(params), OFFLOAD, GPU),
        "amsgrad": why_not_swapped(torch.optim.Adam(params, amsgrad=True), OFFLOAD, GPU),
        "maximize": why_not_swapped(torch.optim.AdamW(params, maximize=True), OFFLOAD, GPU),
        "state": why_not_swapped(stepped, OFFLOAD, GPU),
    }
    assert all(reasons.values()), reasons
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "empty"))  # never compiled inside a trial
    user = torch.optim.Adam(params)
    assert "not built" in why_not_swapped(user, OFFLOAD, GPU) and host_optimizer(user, OFFLOAD, GPU) is user


def test_a_zero_offload_engine_hands_deepspeed_its_cpu_adam(built_cpu_adam, monkeypatch):
    import deepspeed

    given: list = []

    class Given(Exception):
        pass

    def initialize(*, optimizer, **kwargs):
        given.append(optimizer)
        raise Given

    monkeypatch.setattr(deepspeed, "initialize", initialize)
    monkeypatch.setattr(_deepspeed, "device_memory_of", lambda device: 80 * 1024**3)
    zero = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    context = WorkerContext(0, 0, 2, GPU, {}, {"zero_optimization": zero}, strategy="zero2-offload")
    model = torch.nn.Linear(4, 1)
    model.to = lambda *args, **kwargs: model  # (no GPU here)
    with pytest.raises(Given):
        _deepspeed.DeepSpeedEngine(context).prepare_model_and_optimizer(model, torch.optim.AdamW(model.parameters()))
    assert type(given[0]) is built_cpu_adam


@pytest.mark.launch
@pytest.mark.parametrize(("strategy", "built"), [("zero3-offload", True), ("zero2", False)])
def test_an_op_a_strategy_needs_is_built_before_the_pools_first_job(
    strategy, built, saturn_options, tmp_path, monkeypatch, caplog
):
    """The sweep's strategies decide which ops the pool builds first (here an op DeepSpeed does not know, which it
    skips, needed by optimizer offload): a sweep of zero3-offload builds it before its first trial, one of zero2
    does not."""
    monkeypatch.setitem(deepspeed_ops.OPS, "cpu", {"NoSuchOffloadBuilder": "no_such_offload_op"})
    monkeypatch.setitem(deepspeed_ops.NEEDED_WHEN, "NoSuchOffloadBuilder", deepspeed_ops.NEEDED_WHEN["CPUAdamBuilder"])
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    study = optuna.create_study()
    with caplog.at_level("WARNING", logger="optuna.saturn.runner"):
        SaturnExecutor(devices=2, strategies=[strategy], profile=False, **saturn_options).optimize(
            study, gpu_objectives.ranks_environment, n_trials=1
        )
    trial = study.trials[0]
    assert trial.state == TrialState.COMPLETE, trial.system_attrs.get("saturn:fail_reason")
    logs = list(Path(saturn_options["log_dir"]).rglob("deepspeed-ops.log"))
    assert ("Building DeepSpeed's no_such_offload_op" in caplog.text) is built and bool(logs) is built
    if built:
        assert "NoSuchOffloadBuilder does not apply here" in logs[0].read_text()
        assert logs[0].stat().st_mtime <= trial.datetime_start.timestamp()  # (before the first job)
