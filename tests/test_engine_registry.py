"""One registry of engines: templates accept exactly the engines it knows (the package's own and those of other
distributions' entry points), every engine's class and traits agree, and nothing outside the engines' own
declarations branches on an engine's name (a new engine is its module, and an entry point if it comes from
outside)."""

from __future__ import annotations

import ast
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from optuna_saturn.engines import engine_class
from optuna_saturn.profiler import model_state_bytes
from optuna_saturn.strategy import StrategyError, engine_registry, load_strategies, parse_strategy
from optuna_saturn.strategy.engine_registry import BUILTIN_ENGINES, engine_names, traits_of
from optuna_saturn.training import checkpoint

PACKAGE = Path(__file__).resolve().parent.parent / "optuna_saturn"
#: Where engine names may appear as strings: the registry and the built-in engines' declarations.
DECLARATIONS = {PACKAGE / "strategy" / "engine_registry.py", PACKAGE / "strategy" / "builtin_engines.py"}


def _accepted(names: set[str]) -> set[str]:
    accepted = set()
    for name in names:
        table = {"name": "x", "launcher": "torchrun", "engine": name, "max_devices": 1}  # (a one-process engine's)
        try:
            parse_strategy(table, source="x.toml")
        except StrategyError as error:
            assert "known engines" in str(error) and "optuna_saturn.engines" in str(error)
            continue
        accepted.add(name)
    return accepted


@pytest.fixture
def a_plug_in_engine(monkeypatch):
    """An entry point in the ``optuna_saturn.engines`` group, as an installed distribution would declare one."""
    point = EntryPoint("renamed-ddp", "optuna_saturn.strategy.builtin_engines:DDPTraits", "optuna_saturn.engines")
    monkeypatch.setattr(engine_registry, "entry_points", lambda group: [point] if group == point.group else [])
    engine_registry.registered.cache_clear()
    yield point.name
    engine_registry.registered.cache_clear()


def test_templates_accept_exactly_the_registered_engines():
    candidates = {*engine_names(), "tp", "pipeline", "DDP", "zero3", "deepspeed_stage_2"}
    assert _accepted(candidates) == set(engine_names()) == set(BUILTIN_ENGINES)
    assert {s.engine for s in load_strategies(use_entry_points=False).values()} <= set(engine_names())


def test_an_engine_from_an_entry_point_is_accepted_by_templates(a_plug_in_engine):
    assert a_plug_in_engine in engine_names()
    assert _accepted({*engine_names(), "tp"}) == set(BUILTIN_ENGINES) | {a_plug_in_engine}
    strategy = parse_strategy(
        {"name": "x", "launcher": "torchrun", "engine": a_plug_in_engine, "min_devices": 2}, source="x.toml"
    )
    assert strategy.engine_traits.name == a_plug_in_engine


def test_an_entry_point_cannot_take_a_built_in_engines_name(monkeypatch):
    point = EntryPoint("ddp", "elsewhere:Traits", "optuna_saturn.engines")
    monkeypatch.setattr(engine_registry, "entry_points", lambda group: [point])
    engine_registry.registered.cache_clear()
    try:
        with pytest.raises(engine_registry.EngineError, match="name of its own"):
            engine_names()
    finally:
        engine_registry.registered.cache_clear()


@pytest.mark.parametrize("name", sorted(BUILTIN_ENGINES))
def test_each_engines_class_and_traits_agree(name):
    engine = engine_class(name)
    assert engine.checkpoint_format == traits_of(name).checkpoint_format
    assert f"{engine.__module__}:{engine.__name__}" == traits_of(name).engine


def _engine_name_switches(path: Path) -> list[str]:
    """Comparisons of an engine's name with an engine (``x.engine == "fsdp"``, ``"deepspeed" in engines``); a
    strategy's name that is also an engine's (``single``, ``ddp``) may be compared with a strategy."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = any(isinstance(s, ast.Constant) and s.value in BUILTIN_ENGINES for s in sides)
            if named and any("engine" in ast.unparse(s) for s in sides):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_nothing_outside_the_engines_declarations_branches_on_an_engines_name():
    switches = [
        switch
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in DECLARATIONS and PACKAGE / "engines" not in path.parents
        for switch in _engine_name_switches(path)
    ]
    assert switches == []


def test_each_engine_says_which_checkpoints_it_resumes():
    """Torch's format reshards, so any run of an engine that saves it resumes one; DeepSpeed's partitions load on
    as many ranks, or under the same strategy (ZeRO stage) on any number through the universal checkpoint."""

    def record(fmt: str, strategy: str, world_size: int) -> checkpoint.CheckpointRecord:
        return checkpoint.CheckpointRecord("/x", 3, fmt, strategy, world_size, 0.0)

    torch_saved, zero_saved = record(checkpoint.DCP, "fsdp", 2), record(checkpoint.DEEPSPEED, "zero2", 2)
    assert all(checkpoint.can_resume(torch_saved, e, n) for e in ("single", "ddp", "fsdp") for n in (1, 2, 4))
    assert not checkpoint.can_resume(torch_saved, "deepspeed", 2, "zero2")
    assert checkpoint.can_resume(zero_saved, "deepspeed", 4, "zero2")
    assert checkpoint.can_resume(zero_saved, "deepspeed", 2, "zero3")
    assert not checkpoint.can_resume(zero_saved, "deepspeed", 4, "zero3")
    assert not any(checkpoint.can_resume(zero_saved, e, 2, "zero2") for e in ("single", "ddp", "fsdp"))


def test_each_engine_counts_the_model_state_it_keeps_per_device():
    """1 M float32 parameters with Adam's two moments: 4 MB each of parameters and gradients, 8 MB of moments."""
    s = load_strategies(use_entry_points=False)
    per_device = {
        name: model_state_bytes(1_000_000, 4, s[name], 2, optimizer_states=2)
        for name in ("ddp", "fsdp", "fsdp-offload", "zero1", "zero2", "zero3", "zero3-offload")
    }
    assert per_device == {
        "ddp": 16e6,  # a whole replica
        "fsdp": 8e6,  # everything sharded
        "fsdp-offload": 0.0,
        "zero1": 12e6,  # the moments sharded
        "zero2": 10e6,  # and the gradients
        "zero3": 8e6,  # and the parameters
        "zero3-offload": 0.0,
    }
    assert model_state_bytes(1_000_000, 4, s["single"], 1, optimizer_states=2) == 16e6
