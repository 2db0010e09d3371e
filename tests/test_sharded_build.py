"""A model built for fsdp or zero3 is cut as it is built: no rank's host memory holds it whole, and it holds the
values one process builds (``optuna_saturn.engines._sharded_build``)."""

from __future__ import annotations

import optuna
import pytest
import sharded_build_objectives as objectives
import torch
from optuna.trial import TrialState

from optuna_saturn import SaturnExecutor


def _single_loss(kind: str) -> float:
    torch.manual_seed(0)
    model = objectives.build(kind)
    with torch.no_grad():
        return float(objectives.loss_of(kind, model, torch.device("cpu")))


@pytest.mark.launch
@pytest.mark.parametrize("strategy", ["fsdp", "zero3"])
def test_no_rank_holds_a_model_that_fits_only_halved_whole_in_host_memory(saturn_options, strategy):
    """A 384 MiB model in 16 MiB modules, built by the objective before ``trial.prepare`` on 2 CPU devices:
    each rank's host-memory peak through ``trial.prepare`` stays within 0.6 of the model (half of it, and one
    module built whole before it is cut; each rank held a whole copy, and more, before). The prepared model
    computes single's loss, and so does a GPT-2 built from a config, whose ``post_init`` initialises the weights
    again after its modules were cut."""
    study = optuna.create_study()
    for kind in ("mlp", "gpt2"):
        study.enqueue_trial({"model": kind})
    SaturnExecutor(devices=2, strategies=[strategy], profile=False, **saturn_options).optimize(
        study, objectives.built_then_evaluated, n_trials=2
    )
    whole = 4 * sum(p.numel() for p in objectives.build("mlp").parameters())
    for trial in study.trials:
        assert trial.state == TrialState.COMPLETE, trial.system_attrs.get("saturn:fail_reason")
        assert (trial.system_attrs["saturn:strategy"], trial.system_attrs["saturn:num_devices"]) == (strategy, 2)
        kind = trial.params["model"]
        assert trial.value == pytest.approx(_single_loss(kind), rel=1e-6), kind
    peaks = study.trials[0].user_attrs["host_peaks"]
    assert len(peaks) == 2
    held = [peak["partitioned"] if strategy == "zero3" else peak["prepared"] for peak in peaks]
    assert all(isinstance(peak, int) for peak in held), peaks  # (zero3: seen when deepspeed.initialize was called)
    assert max(held) <= 0.6 * whole, (peaks, whole)


class _ReinitialisedInParent(torch.nn.Module):
    """Initialises its children's weights again once they are built (as Hugging Face's ``post_init`` does), reads
    one, ties two, and moves itself to the device: each touches parameters already cut."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 6)
        self.hidden = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(6, 10, bias=False)
        for module in (self.hidden, self.head):
            torch.nn.init.normal_(module.weight, std=0.02)
        self.hidden.weight.data.mul_(float(self.embed.weight.detach().abs().mean()))  # (two cut weights whole at once)
        self.head.weight = self.embed.weight
        self.to(torch.device("cpu"))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.hidden(self.embed(ids))))


def _built_under_a_sharded_build(rank: int, world_size: int, folder: str) -> None:
    """One rank: builds the model and a loss module within the sharded construction, prepares the model alone."""
    import torch.distributed as dist

    from optuna_saturn.engines import WorkerContext, engine_for

    store = dist.FileStore(f"{folder}/store", world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    context = WorkerContext(rank, 0, world_size, torch.device("cpu"), {}, {}, 1, dist.group.WORLD, "fsdp")
    engine = engine_for("fsdp", context)
    with engine.model_construction() as build:
        torch.manual_seed(0)
        model = _ReinitialisedInParent()
        loss_module = torch.nn.Linear(10, 1)  # built, never prepared: whole again after trial.prepare
        model, _ = engine.prepare_model_and_optimizer(model, None)
        modes_left = len(torch.overrides._get_current_function_mode_stack())  # (the training loop runs without it)
        with torch.no_grad():
            value = float(loss_module(model(torch.arange(10))).sum())
    state = engine.full_state_dict(model)
    if rank == 0:
        torch.save((value, state, build.gathers, modes_left), f"{folder}/results.pt")
    dist.barrier()
    dist.destroy_process_group()


def test_code_that_touches_cut_parameters_while_the_model_is_built_sees_single_s_values(tmp_path):
    """Re-initialised in the parent's ``__init__``, read, tied, moved: the prepared model (2 ranks, fsdp) holds
    single's weights, and a module built beside it but not prepared computes single's value."""
    import torch.multiprocessing as mp

    mp.start_processes(_built_under_a_sharded_build, args=(2, str(tmp_path)), nprocs=2, start_method="spawn")
    value, state, gathers, modes_left = torch.load(tmp_path / "results.pt")
    torch.manual_seed(0)
    single = _ReinitialisedInParent()
    loss_module = torch.nn.Linear(10, 1)
    with torch.no_grad():
        expected = float(loss_module(single(torch.arange(10))).sum())
    assert gathers > 0 and modes_left == 0  # (the touches were seen; nothing watches the ops after trial.prepare)
    assert value == pytest.approx(expected, rel=1e-6)
    for name, tensor in single.state_dict().items():
        assert torch.equal(state[name], tensor), name


@pytest.mark.parametrize("engine", ["fsdp", "deepspeed"])
def test_with_the_sharded_build_off_each_rank_builds_the_model_whole(monkeypatch, engine):
    """``OPTUNA_SATURN_SHARDED_BUILD=off`` (an objective whose code before ``trial.prepare`` touches parameters on
    some ranks only): no construction is watched, and nothing is cut; on, a sharding engine on two ranks watches
    its construction."""
    import contextlib

    from optuna_saturn.engines import WorkerContext, engine_for
    from optuna_saturn.engines._sharded_build import ShardedBuild

    context = WorkerContext(
        rank=0,
        local_rank=0,
        world_size=2,
        device=torch.device("cpu"),
        knobs={},
        launcher_config={"zero_optimization": {"stage": 3}},
    )
    assert isinstance(engine_for(engine, context).model_construction(), ShardedBuild)
    monkeypatch.setenv("OPTUNA_SATURN_SHARDED_BUILD", "off")
    construction = engine_for(engine, context).model_construction()
    assert isinstance(construction, contextlib.nullcontext)
    with construction:
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    assert all(p.untyped_storage().nbytes() == p.numel() * p.element_size() for p in model.parameters())


def test_a_tensor_that_gets_the_id_of_a_dropped_cut_parameter_is_not_taken_for_it():
    """A cut parameter the objective dropped is gone; a new tensor may get its ``id`` (a ``Linear`` built after it,
    say): it is not gathered as that parameter (a gather of the wrong shape failed a rank), and the stale entry
    goes."""
    import weakref

    from optuna_saturn.engines._sharded_build import ShardedBuild

    build = ShardedBuild(0, 2, None)
    cut = torch.nn.Parameter(torch.ones(4, 2))
    build._cut(cut)
    assert build._is_cut(cut) and cut.untyped_storage().nbytes() < 4 * 2 * 4
    newcomer, gone = torch.nn.Parameter(torch.ones(1, 10)), torch.nn.Parameter(torch.ones(4, 2))
    build._cut_params[id(newcomer)] = (weakref.ref(gone), torch.ones(2, 2))  # (as if newcomer got gone's id)
    assert not build._is_cut(newcomer) and id(newcomer) not in build._cut_params
