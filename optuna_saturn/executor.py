"""``SaturnExecutor``: run an Optuna study's trials as concurrent distributed jobs on a pool of devices."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from optuna_saturn.capacity import parse_bytes, worker_memory_limit_bytes
from optuna_saturn.devices import DeviceSpec
from optuna_saturn.events import SweepListener
from optuna_saturn.executor_arguments import check_executor_arguments
from optuna_saturn.leases import leased
from optuna_saturn.optimize_arguments import checked
from optuna_saturn.planner import Goal, goal_of
from optuna_saturn.pools.describing import DESCRIBE_TIMEOUT_SECONDS
from optuna_saturn.pools.kinds import PoolKind, pool_closed_on_error
from optuna_saturn.pools.launched import exclusive_mode_conflict
from optuna_saturn.pools.registry import pool_kind
from optuna_saturn.profiler import ProfileStore
from optuna_saturn.progress import ProgressMode, default_listeners
from optuna_saturn.progress.optuna_bar import OptunaProgressBar
from optuna_saturn.real_sweep import RealSweepOptions, real_sweep
from optuna_saturn.strategy import select_strategies
from optuna_saturn.study.interrupts import sigterm_as_keyboard_interrupt
from optuna_saturn.sweep import Sweep, SweepSettings

WORKER_ENV = "OPTUNA_SATURN_WORKER"
_logger = optuna.logging.get_logger("optuna.saturn.executor")


class SaturnExecutor:
    """Runs an Optuna study's trials concurrently, each as a distributed job with its own devices and strategy.

    For every batch of trials it chooses a parallelism strategy and a device count per trial, plans when each
    runs (the SPASE problem), launches them on disjoint devices, and writes every result back through
    ``study.tell``. The study, its sampler, pruner and storage stay in this process; the objective runs in
    launched worker processes and talks to them through a relayed ``trial``.

    Args:
        devices: ``"auto"`` (all CUDA GPUs, else one CPU device per core), an int, or a list of CUDA indices.
        strategies: names of the strategy templates trials may use; ``None`` means every known one.
        solver: planner backend (``"auto"``, ``"cpsat"``, ``"highs"``, ``"gurobi"``, ``"greedy"``, ...).
        strategy_folders: extra folders of strategy templates (TOML).
        allow_shared_cores: on CPU, allow more devices than cores (devices then share cores).
        isolate_network: start each trial in its own loopback-only network namespace (Linux). Launchers listen
            on every interface; use this on shared hosts and in tests.
        log_dir: where each trial's combined log is written.
        artifact_store: an Optuna artifact store; failed trials' logs are uploaded to it.
        plan_time_limit: seconds the planner may spend per plan.
        grace_period: seconds a stopped trial gets to exit after SIGTERM, before SIGKILL.
        listeners: :class:`~optuna_saturn.events.SweepListener` objects told about plans, starts, progress and
            ends (progress displays, dashboard publishers).
        progress: ``"auto"`` (a live rich table on a terminal, plain log lines otherwise), ``"rich"``,
            ``"plain"``, ``"quiet"``, or ``None`` for no progress listener at all.
        dashboard: publish the per-device schedule chart and a plan note to the study for optuna-dashboard.
            ``None``: when optuna-dashboard is installed; ``True``: always (error if it is not installed).
        profile: measure each trial's step time under every feasible (strategy, device count) with short real
            runs before planning it. Needs an objective that uses ``trial.prepare`` and ``trial.steps``; others
            are planned from runtime estimates corrected by the trials that finish.
        profile_store: folder (or :class:`~optuna_saturn.profiler.ProfileStore`) where profiles are cached, by
            what affects speed: reused across trials, sweeps and restarts.
        profile_budget: device-seconds the sweep may spend on profiling jobs (``None``: as much as the value of
            measuring justifies); what is left unmeasured is predicted by the cost model.
        profile_steps: (warm-up, timed) steps of each profiling run.
        describe_timeout: seconds the objective may take, when a trial is described, to reach its first
            ``trial.steps()`` loop (building its data and model, on the meta device). A trial is described in a
            process of the pool (never in yours); one whose objective exits or is killed there ends FAIL with the
            reason, and one that takes longer is planned from runtime estimates and runs (if it hangs there too,
            its start-up limit ends it FAIL). The sweep waits for each description: raise it for a set-up that
            takes longer (a big data set's tokenization, say).
        device_memory: the memory one device may use, in bytes or as ``"2GiB"`` / ``"512MiB"``: the planner leaves
            out options whose model state cannot fit it (parameters, gradients, optimizer state, as each strategy
            shards them) and options whose profiled peak exceeded it. ``None``: a GPU's memory, or a CPU device's
            share of the machine's RAM. On GPUs a smaller value keeps headroom; on CPU devices it is the budget a
            CPU device stands for (a small GPU, say): nothing stops a run from using more, but no option that
            needed more is planned.
        worker_memory_limit: bytes (or ``"8GiB"``) of resident memory past which a warm worker is replaced after
            its job: memory a trial's code leaks, and host memory an offloading trial pinned, do not reach the next
            trial. ``"auto"``: this machine's memory over its devices (on Ray: no limit); ``None``: no limit.
        max_retries: how many times a trial left RUNNING by a sweep that died (``kill -9``, a lost node, the
            out-of-memory killer) is run again. At the start of ``optimize`` such trials end FAIL with the reason
            and their params are enqueued again (``saturn:retry_of``), ahead of new trials; so are the trials of
            this sweep whose rank died or hung; ``n_trials`` still
            counts new trials. Trials of another live sweep on the same study are left alone. A trial that saved
            a checkpoint (``trial.checkpoint``) resumes from it when run again.
        checkpoint_dir: where ``trial.checkpoint`` saves (a folder per study and trial; the trial's
            ``saturn:checkpoint`` attribute says where its latest is). Default: ``<log_dir>/checkpoints``. Use a
            folder the next sweep can read: the one that runs the trial again resumes from it.
        keep_checkpoints: keep a trial's checkpoint after it ends COMPLETE or PRUNED (by default it is removed
            then; a trial that fails keeps it).
        collective_timeout: seconds one collective of a trial (an all-reduce, a barrier) may wait for a peer before
            the trial fails: a rank-0-only evaluation or data preparation between steps must fit in it (the ranks'
            rendezvous has its own limit). NCCL's watchdog ends the trial's processes when it passes.
        stall_timeout: seconds a trial may go without reporting a step, once it has taken one, before it is taken
            for hung (a deadlocked collective, a stuck loader), stopped, and run again like a trial whose rank died
            (``max_retries``, from its checkpoint). ``None``: the longest of 2 minutes, half its planned runtime and
            50 of its steps.
        runner: ``"local"``: trials run on this machine's devices. ``"ray"``: on the alive nodes of a Ray cluster,
            each trial inside one node, by warm workers that are Ray actors pinned to their node's devices; the
            study and its sampler stay in this process. ``devices`` is then read per node (``"auto"``: a node's
            GPUs, else one CPU device per CPU; ``N`` or ``"cpu:N"``: N on every node), and strategies that need
            their own launcher (DeepSpeed's, Accelerate's) are left out. Use a storage every machine can reach
            (PostgreSQL) to watch the sweep from the dashboard, and a ``checkpoint_dir`` they share for trials
            to resume on another node (without one, elastic resize is off).
        ray_address: the Ray cluster to connect to (``"HEAD_IP:6379"``); ``None``: the one this process is
            connected to (``ray.init``), or ``RAY_ADDRESS``, or the one started on this machine (``ray start``).
        pool: where trials run, as an object: ``optuna_saturn.pools.LocalPool()`` (what ``runner="local"``
            means) or ``RayPool(address=...)`` (``runner="ray"``), or a kind of your own that implements
            :class:`~optuna_saturn.pools.PoolKind`. Give either ``pool`` or ``runner``.
        elastic: move a running trial to another strategy or device count (elastic resize) when the plan says the
            sweep then ends sooner by more than twice what the move costs: a long trial left alone on one device
            at the sweep's tail takes the devices that freed, say. Only trials that checkpoint move (once they
            saved a checkpoint in their run): the trial stops right after its next ``trial.checkpoint`` and goes
            on from it under the new option (``saturn:moves`` records each move). At most two moves per trial.
        deadline: plan for every trial the sweep knows of (the queue's, and those ``n_trials`` asks) to end within
            this many seconds of its start (or ``"8h"``, ``"90m"``), at the fewest device-hours: trials get their
            most efficient options where the deadline allows. One the first plan cannot meet is refused before
            any trial starts (``DeadlineUnreachable``, with the earliest end). On a Ray cluster, the nodes no trial
            left needs go back to the cluster. See docs/deadlines-and-budgets.md.
        budget: DEVICE-HOURS the sweep may spend (trials and profiling jobs, devices times runtime): the plans
            are the earliest end within it (the planner's ``Budget`` counts device-seconds: 1 device-hour is
            3,600). Under a deadline or a budget, elastic moves are off.
        price_per_device_hour: what a device-hour costs you; the plans and the sweep's summary say the cost.
        goal: the planner's goal as an instance, in place of ``deadline``/``budget``: ``planner.Makespan()``,
            ``planner.Deadline("8h")``, ``planner.Budget(device_seconds)``, or a ``planner.Goal`` of your own
            (docs/internals.md, "How to add a goal"). Its own ``price_per_device_hour`` counts then.
    """

    @pool_closed_on_error
    def __init__(
        self,
        devices: DeviceSpec = "auto",
        strategies: Sequence[str] | None = None,
        solver: str = "auto",
        *,
        strategy_folders: Sequence[str | os.PathLike] = (),
        allow_shared_cores: bool = False,
        isolate_network: bool = False,
        log_dir: str | os.PathLike = "saturn-runs",
        artifact_store: Any = None,
        plan_time_limit: float = 10.0,
        grace_period: float = 10.0,
        listeners: Sequence[SweepListener] = (),
        progress: ProgressMode | None = "auto",
        dashboard: bool | None = None,
        profile: bool = True,
        profile_store: str | os.PathLike | ProfileStore = "profiles",
        profile_budget: float | None = None,
        profile_steps: tuple[int, int] = (2, 5),
        describe_timeout: float = DESCRIBE_TIMEOUT_SECONDS,
        device_memory: int | str | None = None,
        worker_memory_limit: float | str | None = "auto",
        max_retries: int = 1,
        checkpoint_dir: str | os.PathLike | None = None,
        keep_checkpoints: bool = False,
        stall_timeout: float | None = None,
        collective_timeout: float = 1800.0,
        elastic: bool = True,
        deadline: float | str | None = None,
        budget: float | None = None,
        price_per_device_hour: float = 0.0,
        goal: Goal | None = None,
        runner: str = "local",
        ray_address: str | None = None,
        pool: PoolKind | None = None,
    ) -> None:
        check_executor_arguments(
            devices=devices,
            solver=solver,
            plan_time_limit=plan_time_limit,
            grace_period=grace_period,
            describe_timeout=describe_timeout,
            collective_timeout=collective_timeout,
            stall_timeout=stall_timeout,
            max_retries=max_retries,
        )
        self.pool = pool_kind(pool, runner, ray_address=ray_address)
        elastic = self.pool.elastic(elastic, checkpoint_dir=checkpoint_dir, isolate_network=isolate_network)
        placement = self.pool.place(devices, allow_shared_cores=allow_shared_cores)
        self.devices = placement.devices
        self.strategies = self.pool.runnable(
            select_strategies(
                strategies, placement.largest_trial, device_kind=self.devices[0].kind, folders=list(strategy_folders)
            ),
            strategies,
        )
        conflict = exclusive_mode_conflict(self.devices, self.strategies)
        if conflict:
            _logger.warning(conflict)
        self.solver = solver
        self._quiet_own_log = progress is not None
        self._settings = SweepSettings(
            devices=self.devices,
            strategies=self.strategies,
            solver=solver,
            time_limit=plan_time_limit,
            log_dir=Path(log_dir),
            artifact_store=artifact_store,
            listeners=tuple(default_listeners(progress, dashboard)) + tuple(listeners),
            profile_budget=profile_budget,
            profile_steps=(int(profile_steps[0]), int(profile_steps[1])),
            max_retries=max_retries,
            checkpoint_dir=None if checkpoint_dir is None else Path(checkpoint_dir),
            keep_checkpoints=bool(keep_checkpoints),
            stall_timeout=stall_timeout,
            elastic=bool(elastic),
            goal=goal_of(deadline, budget, price_per_device_hour, goal=goal),
        )
        self._options = RealSweepOptions(
            pool=self.pool,
            placement=placement,
            isolate_network=isolate_network,
            grace_period=grace_period,
            worker_memory_limit=worker_memory_limit_bytes(worker_memory_limit, placement),
            collective_timeout=float(collective_timeout),
            profile_store=(
                None
                if not profile
                else profile_store
                if isinstance(profile_store, ProfileStore)
                else ProfileStore(profile_store)
            ),
            device_memory=None if device_memory is None else parse_bytes(device_memory, "device_memory"),
            describe_timeout=float(describe_timeout),
        )

    def optimize(
        self,
        study: optuna.Study,
        objective: Callable[[Any], float | Sequence[float]],
        n_trials: int | None = None,
        timeout: float | None = None,
        batch_size: int | None = None,
        *,
        callbacks: Sequence[Callable[[optuna.Study, FrozenTrial], None]] | None = None,
        catch: Iterable[type[Exception]] | type[Exception] = (),
        gc_after_trial: bool = False,
        n_jobs: int | None = None,
        show_progress_bar: bool = False,
    ) -> None:
        """Run ``n_trials`` more trials of ``study`` (or until ``timeout`` seconds, or Ctrl-C).

        Trials are asked continuously: ``batch_size`` is the look-ahead, how many asked trials may wait for
        devices at once (default: the number of devices); it is not a barrier. ``timeout`` stops asking for new
        trials; trials already asked still run. Ctrl-C stops every process and ends the running trials as FAIL
        with the reason in their user attrs, then re-raises ``KeyboardInterrupt``.

        ``callbacks``, ``catch``, ``gc_after_trial``, ``n_jobs`` and ``show_progress_bar`` speak
        ``study.optimize``'s language:

        - each callback is called with ``(study, frozen_trial)`` in this process after every trial ends
          (COMPLETE, PRUNED or FAIL), in order; ``study.stop()`` from one (``MaxTrialsCallback``) stops asking,
          and the trials already asked finish. An exception in a callback ends the sweep, as in Optuna.
        - an exception the objective raises ends its trial FAIL (the error in ``saturn:fail_reason``). If ``catch``
          lists it, the sweep goes on; if not (``KeyboardInterrupt`` and ``SystemExit`` included), no trial starts
          after it, the trials already running finish as ``n_jobs`` threads would, and ``optimize`` raises it, as
          ``study.optimize`` does. Faults of the sweep's machinery (a worker killed, a rank lost, out of memory, a
          stall) are never raised: their trials run again (``max_retries``) or on another option.
        - ``gc_after_trial`` runs ``gc.collect()`` in this process after each trial, after the callbacks; worker
          processes always collect (and empty the CUDA cache) after each job.
        - ``n_jobs``: the most trials running at once (each on one device or more); None (the default) or -1, one
          per device. A trial is never split into threads: ``n_jobs=1`` on 4 devices runs one trial at a time.
        - ``show_progress_bar`` draws Optuna's own bar, beside the executor's display (``progress=``); as in
          Optuna, not for a ``timeout`` alone with ``n_jobs`` other than 1 (a warning says so).
        """
        args = checked(
            study,
            devices=len(self.devices),
            n_trials=n_trials,
            timeout=timeout,
            batch_size=batch_size,
            n_jobs=n_jobs,
            catch=catch,
            callbacks=callbacks,
            show_progress_bar=show_progress_bar,
        )
        self._run(
            study.study_name,
            timeout,
            real_sweep(
                self._with_bar(n_trials, timeout) if args.show_progress_bar else self._settings,
                self._options,
                study,
                objective,
                n_trials=n_trials,
                timeout=timeout,
                batch_size=args.batch_size,
                callbacks=list(callbacks or ()),
                gc_after_trial=bool(gc_after_trial),
                catch=args.catch,
                n_jobs=args.n_jobs,
            ),
        )

    def _with_bar(self, n_trials: int | None, timeout: float | None) -> SweepSettings:
        """The settings with Optuna's own progress bar among the listeners (``show_progress_bar=True``)."""
        bar = OptunaProgressBar(n_trials, timeout)
        return dataclasses.replace(self._settings, listeners=(*self._settings.listeners, bar))

    def profile(
        self,
        objective: Callable[[Any], float | Sequence[float]],
        n_trials: int | None = None,
        *,
        seed: int = 0,
        params: Sequence[dict[str, Any]] = (),
    ) -> optuna.Study:
        """Profile configurations of ``objective`` into the profile store, and run nothing: ``params`` (each a
        trial's parameters, as ``study.enqueue_trial`` takes them), then ``n_trials`` sampled ones.

        Warms the cache for later sweeps: profiling the trials you are about to enqueue makes their first plan a
        plan of measured options. Returns a throw-away in-memory study whose trials carry the ``saturn:profiles``
        and ``saturn:options`` user attributes; the trials themselves are never run.
        """
        if self._options.profile_store is None:
            raise ValueError("profile() needs profiling on: create the executor with profile=True.")
        n_trials = len(params) + (n_trials or 0)
        if n_trials < 1:
            raise ValueError("profile() needs n_trials >= 1 or params to profile.")
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
        for fixed in params:
            study.enqueue_trial(dict(fixed))
        settings = dataclasses.replace(self._settings, profile_only=True)
        sweep = real_sweep(
            settings, self._options, study, objective, n_trials=n_trials, timeout=None, batch_size=max(n_trials, 1)
        )
        self._run("(profiling)", None, sweep)
        return study

    def _run(self, study_name: str, timeout: float | None, sweep: Sweep) -> None:
        """Run ``sweep`` once this machine's devices are leased to it (:mod:`optuna_saturn.leases`: another sweep
        on the machine may hold them; a Ray sweep's actors lease theirs on their nodes)."""
        if os.environ.get(WORKER_ENV):
            raise RuntimeError(
                "SaturnExecutor was called inside a worker process. Put the code that starts the sweep under "
                '`if __name__ == "__main__":` so that workers only import your objective.'
            )
        saturn_logger = logging.getLogger("optuna.saturn")
        level = saturn_logger.level
        if self._quiet_own_log:  # the progress display says the same, better
            saturn_logger.setLevel(logging.WARNING)
        placement = self._options.placement
        devices = self._settings.devices if placement is None or placement.leases_here else []
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            with (
                sigterm_as_keyboard_interrupt(),
                leased(devices, study=study_name, deadline=deadline, say=_logger.warning) as ready,
            ):
                if not ready:
                    _logger.warning("The timeout passed while other sweeps held this sweep's devices: no trial ran.")
                    return
                sweep.run()
        finally:
            saturn_logger.setLevel(level)
