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
from optuna_saturn.pools.kinds import BackendOptions, Placement, PoolKind
from optuna_saturn.pools.launched import LaunchedJobs, owns_its_processes
from optuna_saturn.pools.processes import ProcessPool
from optuna_saturn.pricing.pricer import Pricer
from optuna_saturn.profiler import ProfileStore
from optuna_saturn.strategy import nothing_to_choose
from optuna_saturn.sweep import Sweep, SweepSettings, assemble
from optuna_saturn.sweep.requests import run_folder


@dataclass(frozen=True)
class RealSweepOptions:
    """The executor's options that only a real sweep's pool and pricer read (its loop never does)."""

    pool: PoolKind  # where trials run
    placement: Placement | None = None  # the devices the pool found (None: the settings' devices, here)
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
    """The sweep of ``study`` on real processes (wherever the pool kind runs them) and wall time."""
    placement = options.placement or Placement(settings.devices, largest_trial(settings.devices))
    largest = placement.largest_trial
    if nothing_to_choose(settings.strategies, largest) and not settings.profile_only:
        # one option: an asked trial needs no description; it starts as soon as a device is free (the queue's
        # trials are still described ahead: their runtimes decide the order)
        settings = dataclasses.replace(settings, describe_asked=False)
    study_lock = threading.Lock()  # (the pricer describes trials under the study's lock)
    run_dir = run_folder(settings.log_dir, study.study_name)
    pool = ProcessPool(
        objective,
        warm=options.pool.warm_backend(
            placement,
            BackendOptions(
                strategies=settings.strategies,
                log_dir=run_dir / "workers",
                study_name=study.study_name,
                grace_period=options.grace_period,
                memory_limit=options.worker_memory_limit,
                collective_timeout=options.collective_timeout,
                isolate_network=options.isolate_network,
            ),
        ),
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
            hardware=placement.hardware,
            device_memory=device_capacity(options.device_memory, settings.devices, placement),
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
