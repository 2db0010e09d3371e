"""Mutations of the pool-kind seam: ``SaturnExecutor(pool=...)`` asks the kind it is given, and nothing outside
``pools/`` picks a kind."""

from mutations import Mutation

_POINTS = "tests/test_plugin_points.py"

MUTATIONS: list[Mutation] = [
    Mutation(
        name="pool-object-ignored",
        contract="the executor runs on the pool kind it is given, asking it for devices, strategies and workers",
        path="optuna_saturn/pools/registry.py",
        old="        return pool\n",
        new="        return LocalPool()\n",
        tests=(f"{_POINTS}::test_a_pool_kind_written_outside_the_package_runs_a_sweep",),
    ),
    Mutation(
        name="ray-strategies-not-filtered",
        contract="a Ray pool leaves out the strategies whose launcher must own the trial's processes",
        path="optuna_saturn/pools/node_rules.py",  # (the rule Ray's pool and SLURM's share)
        old='    return [s for s in strategies if s.launcher == "torchrun"]',
        new="    return strategies",
        tests=(
            "tests/test_ray_runner.py::test_a_ray_pool_leaves_out_the_strategies_whose_launcher_must_own_the_processes",
        ),
    ),
    Mutation(
        name="pool-entry-points-ignored",
        contract="runner= names a pool kind another installed distribution declares in the optuna_saturn.pools group",
        path="optuna_saturn/pools/registry.py",
        old="        found[point.name] = point\n",
        new="        pass\n",
        tests=("tests/test_plugin_package.py::test_a_pool_and_a_strategy_from_an_installed_plug_in_run_a_sweep",),
    ),
]
