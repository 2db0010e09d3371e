"""Mutations of the one registry of engines: templates accept the registry's engines (entry points included), and
what differs between engines is read from each engine's traits, not from switches on its name."""

from mutations import Mutation

_REGISTRY = "tests/test_engine_registry.py"
_PLUG_IN = "tests/test_plugin_package.py"

MUTATIONS: list[Mutation] = [
    Mutation(
        name="templates-keep-their-own-engine-list",
        contract="a template's engine is checked against the registry, not a second list of the built-in names",
        path="optuna_saturn/strategy/__init__.py",
        old='        engine = traits_of(data["engine"])  # (an unknown name\'s error lists the known ones)',
        new='        engine = traits_of(data["engine"] if data["engine"] in ("single", "ddp", "fsdp", "deepspeed") '
        'else "?")',
        tests=(
            f"{_REGISTRY}::test_an_engine_from_an_entry_point_is_accepted_by_templates",
            f"{_PLUG_IN}::test_a_strategy_whose_engine_comes_from_a_plug_in_runs_a_trial_under_that_engine",
        ),
    ),
    Mutation(
        name="engine-entry-points-ignored",
        contract="engines declared in the optuna_saturn.engines entry-point group are registered",
        path="optuna_saturn/strategy/engine_registry.py",
        old="    for point in entry_points(group=ENTRY_POINT_GROUP):",
        new="    for point in entry_points(group=ENTRY_POINT_GROUP)[:0]:",
        tests=(
            f"{_REGISTRY}::test_an_engine_from_an_entry_point_is_accepted_by_templates",
            f"{_PLUG_IN}::test_a_strategy_whose_engine_comes_from_a_plug_in_runs_a_trial_under_that_engine",
        ),
    ),
    Mutation(
        name="floor-switches-on-an-engine-name",
        contract="nothing outside the engines' declarations compares an engine with an engine's name",
        path="optuna_saturn/pricing/floors.py",
        old="    return not strategy.engine_traits.trades_compute_for_memory(strategy.knobs, strategy.launcher_config)",
        new='    return strategy.engine != "fsdp" or not strategy.knobs.get("cpu_offload")',
        tests=(f"{_REGISTRY}::test_nothing_outside_the_engines_declarations_branches_on_an_engines_name",),
    ),
    Mutation(
        name="deepspeed-resumes-any-world-size",
        contract="a DeepSpeed checkpoint resumes only on as many ranks, or under the same strategy",
        path="optuna_saturn/strategy/builtin_engines.py",
        old="saved.world_size == world_size or strategy == saved.strategy",
        new="True",
        tests=(f"{_REGISTRY}::test_each_engine_says_which_checkpoints_it_resumes",),
    ),
    Mutation(
        name="fsdp-state-not-sharded",
        contract="FSDP's model state per device is the whole model's divided by the device count",
        path="optuna_saturn/strategy/builtin_engines.py",
        old='        return 0.0 if knobs.get("cpu_offload") else (params + grads + states) / devices',
        new='        return 0.0 if knobs.get("cpu_offload") else (params + grads + states)',
        tests=(f"{_REGISTRY}::test_each_engine_counts_the_model_state_it_keeps_per_device",),
    ),
]
