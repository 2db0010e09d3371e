"""A sweep on real processes and wall time: the pool (a warm backend, and launched jobs where a strategy's launcher
must own its processes) and the pricer, built from the executor's options. The simulator builds the same loop on
a simulated pool and known prices instead (:mod:`optuna_saturn.simulation.simulator`)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import optuna

from optuna_saturn.capacity import device_capacity
from optuna_saturn.clock import WallClock
from optuna_saturn.devices import largest_trial
from optuna_saturn.pools.describing import DESCRIBE_TIMEOUT_SECONDS, Describer
from optuna_saturn.pools.launched import LaunchedJobs, owns_its_processes
from optuna_saturn.pools.processes import ProcessPool
from optuna_saturn.pools.ray import RayPool
from optuna_saturn.pools.ray_cluster import RayCluster
from optuna_saturn.pools.warm import WorkerPool
from optuna_saturn.pools.warm_backend import WarmBackend
from optuna_saturn.pricing.pricer import Pricer
from optuna_saturn.profiler import ProfileStore
from optuna_saturn.strategy import nothing_to_choose
from optuna_saturn.sweep import Sweep, SweepSettings, assemble
from optuna_saturn.sweep.requests import run_folder


@dataclass(frozen=True)
class RealSweepOptions:
    """The executor's options that only a real sweep's pool and pricer read (its loop never does)."""

    cluster: RayCluster | None = None  # the Ray runner's cluster (None: the local runner, this machine's devices)
    isolate_network: bool = False  # each launched trial in its own loopback-only network namespace
    grace_period: float = 10.0  # seconds a stopped trial gets after SIGTERM
    worker_memory_limit: float | None = None  # bytes: a warm worker that grows past it is replaced
    collective_timeout: float = 1800.0  # seconds one collective may wait for a peer before the job fails
    profile_store: ProfileStore | None = None  # None: plan from runtime estimates only
    device_memory: int | None = None  # bytes one device may use (None: a GPU's memory, a CPU device's RAM share)
    describe_timeout: float = DESCRIBE_TIMEOUT_SECONDS  # seconds one description may take (then: estimates)


def real_sweep(
    settings: SweepSettings,
    options: RealSweepOptions,
    study: optuna.Study,
    objective: Callable[..., Any],
    **sweep_options: Any,
) -> Sweep:
    """The sweep of ``study`` on real processes (this machine's or a Ray cluster's) and wall time."""
    cluster = options.cluster
    largest = max(len(n.devices) for n in cluster.nodes) if cluster else largest_trial(settings.devices)
    node = None if cluster is None else cluster.nodes[0]  # (the nodes of a cluster are alike)
    if nothing_to_choose(settings.strategies, largest) and not settings.profile_only:
        # one option: an asked trial needs no description; it starts as soon as a device is free (the queue's
        # trials are still described ahead: their runtimes decide the order)
        settings = dataclasses.replace(settings, describe_asked=False)
    study_lock = threading.Lock()  # (the pricer describes trials under the study's lock)
    run_dir = run_folder(settings.log_dir, study.study_name)
    pool = ProcessPool(
        objective,
        warm=_warm_backend(settings, options, largest, run_dir / "workers", study.study_name),
        launched=(
            LaunchedJobs(settings.devices, isolate_network=options.isolate_network, grace_period=options.grace_period)
            if any(owns_its_processes(s) for s in settings.strategies)
            else None
        ),
        describer=(
            None
            if options.profile_store is None
            else Describer(
                settings.devices,
                log=run_dir / "workers" / "describer.log",
                isolate_network=options.isolate_network,
                limit=options.describe_timeout,
            )
        ),
    )
    pricer = None
    if options.profile_store is not None:
        pricer = Pricer(
            describe=partial(pool.describe, lock=study_lock, study=study),
            strategies=settings.strategies,
            pool=settings.devices,
            store=options.profile_store,
            max_devices=largest,
            hardware=None if node is None else node.hardware,
            device_memory=device_capacity(options.device_memory, settings.devices, node),
        )
    sweep = assemble(
        settings,
        study,
        pool=pool,
        clock=WallClock(),
        prices=pricer,
        study_lock=study_lock,
        run_dir=run_dir,
        **sweep_options,
    )
    pool.while_describing = sweep.while_describing  # (a description takes seconds: ready trials start meanwhile)
    return sweep


def _warm_backend(
    settings: SweepSettings, options: RealSweepOptions, largest: int, log_dir: Any, study_name: str
) -> WarmBackend:
    common: dict[str, Any] = dict(
        memory_limit=options.worker_memory_limit,
        collective_timeout=options.collective_timeout,
        log_dir=log_dir,
        grace_period=options.grace_period,
        engines={s.engine for s in settings.strategies},
        multi_device=any(n > 1 for s in settings.strategies for n in s.device_counts(largest)),
    )
    if options.cluster is not None:
        return RayPool(options.cluster, study=study_name, **common)
    return WorkerPool(
        settings.devices,
        isolate_network=options.isolate_network,
        one_process=any(s.one_process for s in settings.strategies),
        deepspeed_configs=[dict(s.launcher_config) for s in settings.strategies if s.engine == "deepspeed"],
        **common,
    )
