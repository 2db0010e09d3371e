"""Building a sweep: its state, the policies that decide, and the effects that carry their decisions out, over
the study (a gateway, with an outbox where the storage is shared; its queue), the job requests and where trials
resume from. Every part gets what it needs here, once: none is handed another part later."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial

from optuna_saturn.clock import Clock
from optuna_saturn.events import Broadcast
from optuna_saturn.pools.protocol import Pool
from optuna_saturn.pricing.source import PriceSource
from optuna_saturn.study.folders import study_folder
from optuna_saturn.study.gateway import StudyGateway
from optuna_saturn.study.outbox import Outbox
from optuna_saturn.study.ownership import Owner
from optuna_saturn.study.queue import StudyQueue
from optuna_saturn.sweep.asking import Asking
from optuna_saturn.sweep.effects import Effects, World
from optuna_saturn.sweep.elastic import Elastic
from optuna_saturn.sweep.faults import Faults
from optuna_saturn.sweep.loop import Sweep
from optuna_saturn.sweep.options import OptionsView
from optuna_saturn.sweep.outcomes import Outcomes
from optuna_saturn.sweep.parts import Parts
from optuna_saturn.sweep.planning import Planning
from optuna_saturn.sweep.policy import Policy
from optuna_saturn.sweep.profiling import Profiling
from optuna_saturn.sweep.releasing import Releasing
from optuna_saturn.sweep.requests import JobRequests, run_folder
from optuna_saturn.sweep.resumes import Resumes
from optuna_saturn.sweep.settings import SweepSettings
from optuna_saturn.sweep.state import SweepState
from optuna_saturn.sweep.unstarted import Unstarted


def assemble(
    settings: SweepSettings,
    study: optuna.Study,
    *,
    pool: Pool,
    clock: Clock,
    prices: PriceSource | None,
    study_lock: threading.Lock | None = None,
    run_dir: Path | None = None,
    n_trials: int | None,
    timeout: float | None,
    batch_size: int,
    callbacks: Sequence[Callable[[optuna.Study, FrozenTrial], None]] = (),
    gc_after_trial: bool = False,
    catch: tuple[type[BaseException], ...] = (),
    n_jobs: int | None = None,
    more_policies: Sequence[Policy] = (),
) -> Sweep:
    """The sweep of ``study`` on ``pool``, on ``clock``'s time; ``prices`` price its trials (None: runtime
    estimates alone), describing them under ``study_lock``, the lock every call into the study takes.
    ``more_policies``: rules of the caller's. The loop calls their hooks after elastic's and before profiling's,
    faults' and outcomes' (those settle every job's end: a rule after them would never see one)."""
    state = SweepState(clock.now(), list(settings.devices), n_trials=n_trials, n_jobs=n_jobs)
    state.nodes_seen({d.node: pool.node_of(d) for d in settings.devices})
    folder = study_folder(study)  # (not the study's name: two storages may hold studies of one name)
    owner = Owner.of_this_process()
    gateway = StudyGateway(
        study,
        artifact_store=settings.artifact_store,
        outbox=Outbox(settings.log_dir / "outbox" / folder) if settings.owned else None,
        owner=owner.to_json() if settings.owned else None,
        lock=study_lock,
    )
    strategies = {s.name: s for s in settings.strategies}
    root = (settings.checkpoint_dir or settings.log_dir / "checkpoints") / folder
    requests = JobRequests(
        run_dir=run_dir or run_folder(settings.log_dir, study.study_name),
        checkpoint_root=root,
        strategies=strategies,
        profile_steps=settings.profile_steps,
        lock=gateway.lock,
        clock=clock,
        on_stop=gateway.request_stop,
    )
    requests.study = study  # (what a queued trial's snapshot names as its study)
    # whether every device reads a checkpoint another wrote: the pool's do, or they are in a folder the user named
    shared = pool.shares_checkpoints or settings.checkpoint_dir is not None
    resumes = Resumes(state, strategies, root=root, exists=pool.has_checkpoint, shared=shared)
    resumes.on_disk = pool.checkpoints_on_disk  # (a simulated pool's checkpoints are on no disk)
    view = OptionsView.for_sweep(settings, study, state.largest_node)
    world = World(
        state,
        clock,
        pool,
        gateway,
        StudyQueue(gateway, clock),
        requests,
        resumes,
        Broadcast(settings.listeners, study),
        owner,
        prices,
        view,
        keep_checkpoints=settings.keep_checkpoints,
        callbacks=list(callbacks),
        gc_after_trial=gc_after_trial,
    )
    describes = prices is not None
    asking = Asking.for_sweep(settings, timeout=timeout, lookahead=batch_size, describes=describes, catch=catch)
    planning = Planning(settings)
    profiling = Profiling(prices, budget=settings.profile_budget, profile_only=settings.profile_only)
    # Every rule, in the order the loop calls their hooks (sweep/policy.py). The order matters: asking notes the
    # first round before releasing reads it; releasing gives devices back before a move or a profiling job counts on
    # them; elastic, then profiling, see a job's end before faults and outcomes, which settle a trial's; faults
    # say whether it runs again before outcomes tell it; the queue's unstarted trials go back last.
    policies: tuple[Policy, ...] = (
        asking,
        planning,
        Releasing(enabled=settings.goal.whole_sweep),
        Elastic(
            # (moves serve the makespan: under a deadline or a budget the trials keep their options)
            enabled=settings.elastic and not settings.profile_only and settings.goal.earliest_end,
            max_moves=settings.max_moves,
            engines={s.name: s.engine for s in settings.strategies},
            seed=settings.seed,
            plan_work=settings.plan_work,
        ),
        *more_policies,
        profiling,
        Faults.for_sweep(settings, may_leave_out=describes, taken_over=gateway.taken_over),
        Outcomes(catch=catch),
        Unstarted(asking),
    )
    return Sweep(
        Parts(
            settings, pool, clock, bool(callbacks), state, Effects(world), view, policies, asking, planning, profiling
        )
    )
