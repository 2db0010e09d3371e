"""Where new kinds plug in, each is a declared ``Protocol``, and every implementation offers all of it, with
parameters the protocol's callers may pass: a pool (real processes, the simulator), a warm backend (this machine's
workers, Ray's), a price source (the pricer, known prices). A new kind (a Kubernetes pool, a team's profile
service) is written against the protocol; this test is what holds the two implementations to it."""

from __future__ import annotations

import inspect
from typing import Protocol

import pytest

from optuna_saturn.pools.processes import ProcessPool
from optuna_saturn.pools.protocol import Pool
from optuna_saturn.pools.ray import RayPool
from optuna_saturn.pools.warm import WorkerPool
from optuna_saturn.pools.warm_backend import WarmBackend
from optuna_saturn.pricing.pricer import Pricer
from optuna_saturn.pricing.source import PriceSource
from optuna_saturn.simulation.pool import SimulatedPool
from optuna_saturn.simulation.prices import KnownPrices

PLUG_IN_POINTS = [
    (Pool, [ProcessPool, SimulatedPool]),
    (WarmBackend, [WorkerPool, RayPool]),
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
