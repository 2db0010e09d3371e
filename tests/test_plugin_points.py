"""Where new kinds plug in, each is a declared ``Protocol``, and every implementation offers all of it, with
parameters the protocol's callers may pass: a pool (real processes, the simulator), a warm backend (this machine's
workers, Ray's), a price source (the pricer, known prices), a pool kind (this machine, a Ray cluster), which
``SaturnExecutor(pool=...)`` takes. A new kind (a Kubernetes pool, a team's profile service) is written against
the protocol; this test is what holds the two implementations to it, and a kind written outside the package runs
a sweep."""

from __future__ import annotations

import inspect
from typing import Protocol

import pytest

from optuna_saturn.pools.kinds import PoolKind
from optuna_saturn.pools.local_kind import LocalPool
from optuna_saturn.pools.processes import ProcessPool
from optuna_saturn.pools.protocol import Pool
from optuna_saturn.pools.ray import RayWorkers
from optuna_saturn.pools.ray_kind import RayPool
from optuna_saturn.pools.warm import WorkerPool
from optuna_saturn.pools.warm_backend import WarmBackend
from optuna_saturn.pricing.pricer import Pricer
from optuna_saturn.pricing.source import PriceSource
from optuna_saturn.simulation.known_prices import KnownPrices
from optuna_saturn.simulation.pool import SimulatedPool

PLUG_IN_POINTS = [
    (Pool, [ProcessPool, SimulatedPool]),
    (WarmBackend, [WorkerPool, RayWorkers]),
    (PoolKind, [LocalPool, RayPool]),
    (PriceSource, [Pricer, KnownPrices]),
]


def _members(protocol: type) -> set[str]:
    """The protocol's methods, read-only attributes (properties) and attributes (annotations), as it declares them."""
    declared = {
        n for n, v in vars(protocol).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))
    }
    return declared | set(getattr(protocol, "__annotations__", {}))


def _attributes_set_in_init(cls: type) -> set[str]:
    source = inspect.getsource(cls.__init__) if "__init__" in vars(cls) else ""
    return {line.split("self.", 1)[1].split(" ")[0].split(":")[0] for line in source.splitlines() if "self." in line}


@pytest.mark.parametrize(("protocol", "implementations"), PLUG_IN_POINTS, ids=lambda p: getattr(p, "__name__", ""))
def test_every_plug_in_point_is_a_protocol_that_each_implementation_offers_in_full(protocol, implementations):
    assert issubclass(protocol, Protocol) and protocol._is_protocol  # declared, not duck-typed
    members = _members(protocol)
    assert members, f"{protocol.__name__} declares nothing"
    for cls in implementations:
        offered = set(dir(cls)) | _attributes_set_in_init(cls)
        assert members - offered == set(), f"{cls.__name__} lacks part of {protocol.__name__}"
        for name in members:
            wanted = vars(protocol).get(name)
            if not inspect.isfunction(wanted):
                continue
            given = inspect.signature(getattr(cls, name))
            takes_any = any(p.kind is p.VAR_KEYWORD for p in given.parameters.values())
            for parameter in list(inspect.signature(wanted).parameters.values())[1:]:
                if parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
                    continue
                assert parameter.name in given.parameters or takes_any, (
                    f"{cls.__name__}.{name} takes no {parameter.name!r}, which {protocol.__name__} callers pass"
                )


def test_the_checker_finds_a_missing_member():
    class Partial:
        def workload(self, number):
            return None

    assert _members(PriceSource) - set(dir(Partial)) >= {"price", "record", "learn_from_run"}


class _HalfTheMachine:
    """A pool kind written outside the package against :class:`PoolKind` alone: it runs trials on the first of
    this machine's devices only, and notes what the executor asked of it."""

    name = "half"

    def __init__(self) -> None:
        self.asked: list[str] = []

    def place(self, devices, *, allow_shared_cores):
        from optuna_saturn.devices import resolve_devices
        from optuna_saturn.pools.kinds import Placement

        self.asked.append("place")
        first = resolve_devices(devices, allow_shared_cores=allow_shared_cores)[:1]
        return Placement(first, 1)

    def runnable(self, strategies, asked):
        self.asked.append("runnable")
        return [s for s in strategies if s.name == "single"]

    def elastic(self, wanted, *, checkpoint_dir, isolate_network):
        self.asked.append("elastic")
        return False

    def warm_backend(self, placement, options):
        self.asked.append("warm_backend")
        return WorkerPool(placement.devices, isolate_network=options.isolate_network, **options.common(1))


@pytest.mark.launch
def test_a_pool_kind_written_outside_the_package_runs_a_sweep(saturn_options, tmp_path):
    """``pool=`` takes any object of the protocol: the executor asks it for the devices, the strategies it runs
    and its workers, and names no kind itself."""
    import objectives
    import optuna

    from optuna_saturn import SaturnExecutor

    kind = _HalfTheMachine()
    executor = SaturnExecutor(devices=2, pool=kind, **saturn_options)
    assert [str(d) for d in executor.devices] == ["cpu:0"] and [s.name for s in executor.strategies] == ["single"]
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    executor.optimize(study, objectives.quadratic, n_trials=3)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 3
    assert [t.system_attrs["saturn:devices"] for t in study.trials] == [["cpu:0"]] * 3
    assert kind.asked == ["elastic", "place", "runnable", "warm_backend"]


def test_pool_and_runner_are_one_choice_and_a_pool_must_be_a_pool_kind():
    from optuna_saturn import SaturnExecutor

    with pytest.raises(ValueError, match="either pool= or runner="):
        SaturnExecutor(devices=1, pool=LocalPool(), runner="ray")
    with pytest.raises(TypeError, match=r"lacks \['name', 'place', 'runnable', 'elastic', 'warm_backend'\]"):
        SaturnExecutor(devices=1, pool="ray")
    with pytest.raises(TypeError, match=r"not its class: pass LocalPool\(\)"):
        SaturnExecutor(devices=1, pool=LocalPool)
    with pytest.raises(ValueError, match="runner must be one of"):
        SaturnExecutor(devices=1, runner="nope")
    assert isinstance(SaturnExecutor(devices=1).pool, LocalPool)
