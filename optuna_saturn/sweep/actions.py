"""How the loop carries out its policies' decisions: the only code, with the loop, that talks to the pool and to
the study. It decides nothing: each method does what a decision says, and records it in the sweep's state."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from optuna_saturn import checkpoint
from optuna_saturn.clock import Clock
from optuna_saturn.events import Broadcast, ProfileEvent, TrialMove, TrialProgress, TrialStart
from optuna_saturn.pools.protocol import JobEnd, Pool
from optuna_saturn.pricing.prices import TrialPrice
from optuna_saturn.pricing.source import PriceSource
from optuna_saturn.study.folders import study_folder
from optuna_saturn.study.gateway import ATTR, StudyGateway, ended_by_another
from optuna_saturn.study.outbox import Outbox
from optuna_saturn.study.ownership import Owner, run_again
from optuna_saturn.study.queue import StudyQueue
from optuna_saturn.sweep import reporting
from optuna_saturn.sweep.decisions import Fail, LeaveOut, Measure, Planned, RequestMove, Start, Stop, Tell
from optuna_saturn.sweep.faults import profile_results
from optuna_saturn.sweep.options import OptionsView
from optuna_saturn.sweep.profiling import Profiling
from optuna_saturn.sweep.requests import JobRequests, run_folder
from optuna_saturn.sweep.resumes import Resumes
from optuna_saturn.sweep.settings import SweepSettings
from optuna_saturn.sweep.state import ProfileRun, SweepState, TrialRun, Waiting

_logger = optuna.logging.get_logger("optuna.saturn")


class Actions:
    def __init__(
        self,
        state: SweepState,
        *,
        pool: Pool,
        gateway: StudyGateway,
        queue: StudyQueue,
        requests: JobRequests,
        resumes: Resumes,
        events: Broadcast,
        owner: Owner,
        keep_checkpoints: bool,
        callbacks: Sequence[Callable[[optuna.Study, FrozenTrial], None]],
        gc_after_trial: bool,
    ) -> None:
        self._state, self._pool, self.gateway, self.queue = state, pool, gateway, queue
        self._requests, self.resumes, self.events, self.owner = requests, resumes, events, owner
        self._keep_checkpoints = keep_checkpoints
        self._callbacks, self._gc_after_trial = list(callbacks), gc_after_trial
        self._pricer: PriceSource | None = None
        self._view: OptionsView | None = None
        self._profiling: Profiling | None = None

    @classmethod
    def for_sweep(
        cls,
        settings: SweepSettings,
        study: optuna.Study,
        state: SweepState,
        *,
        pool: Pool,
        clock: Clock,
        run_dir: Path | None,
        callbacks: Sequence[Callable[[optuna.Study, FrozenTrial], None]],
        gc_after_trial: bool,
        study_lock: threading.Lock | None = None,
    ) -> Actions:
        """The sweep's mechanisms: its study gateway (with an outbox where the storage is shared), the study's
        queue, the job requests and where trials resume from."""
        folder = study_folder(study)  # (not the study's name: two storages may hold studies of one name)
        outbox = Outbox(settings.log_dir / "outbox" / folder) if settings.owned else None
        owner = Owner.of_this_process()
        gateway = StudyGateway(
            study,
            artifact_store=settings.artifact_store,
            outbox=outbox,
            owner=owner.to_json() if settings.owned else None,
            lock=study_lock,
        )
        strategies = {s.name: s for s in settings.strategies}
        root = (settings.checkpoint_dir or settings.log_dir / "checkpoints") / folder
        run_dir = run_dir or run_folder(settings.log_dir, study.study_name)
        steps, lock = settings.profile_steps, gateway.lock
        requests = JobRequests(
            run_dir=run_dir, checkpoint_root=root, strategies=strategies, profile_steps=steps, lock=lock, clock=clock
        )
        requests.study = study  # (what a queued trial's snapshot names as its study)
        # whether every device reads a checkpoint another wrote: the pool's do, or they are in a folder the user named
        shared = pool.shares_checkpoints or settings.checkpoint_dir is not None
        resumes = Resumes(state, strategies, root=root, exists=pool.has_checkpoint, shared=shared)
        resumes.on_disk = pool.checkpoints_on_disk  # (a simulated pool's checkpoints are on no disk)
        return cls(
            state,
            pool=pool,
            gateway=gateway,
            queue=StudyQueue(gateway, clock),
            requests=requests,
            resumes=resumes,
            events=Broadcast(settings.listeners, study),
            owner=owner,
            keep_checkpoints=settings.keep_checkpoints,
            callbacks=callbacks,
            gc_after_trial=gc_after_trial,
        )

    def use(self, *, pricer: PriceSource | None, view: OptionsView, profiling: Profiling) -> None:
        """What prices trials, the planner's view of them, and the profiling policy (follow-up jobs go there)."""
        self._pricer, self._view, self._profiling = pricer, view, profiling

    @property
    def run_dir(self) -> Path:
        return self._requests.run_dir

    # -- trials coming in -------------------------------------------------------------------------------------------
    def own(self, trial: optuna.Trial) -> None:
        """A trial this sweep asked or took from the queue (the gateway made it ours): it counts towards
        ``n_trials``."""
        self._state.asked += 1

    def price(
        self, trial: optuna.Trial, *, leaving: tuple | None = None, was: list | None = None, describe: bool = False
    ) -> TrialPrice:
        """The trial's options that its checkpoint allows (``describe``: a new trial, described now; else priced
        again from its description, if any); recorded on the trial (``saturn:options``) unless they are what it
        ``was`` priced (a storage write per trial and event costs a large sweep's loop more than the re-pricing)."""
        described = self._pricer is not None and (describe or self._pricer.workload(trial.number) is not None)
        price = self._pricer.price(trial) if described else TrialPrice(None)
        if price.workload is None:  # cannot be described: planned from runtime estimates
            price.options = self._view.estimator.priced()
        price = self.resumes.restricted(trial.number, price, leaving=leaving)
        options = [p.option.to_json() for p in price.options]
        if self._pricer is not None and options != was:
            survival = self._view.survival  # (what it assumed, where it plans for the pruner)
            assumed = {} if survival.blind else {"pruning_assumed": survival.describe()}
            self.gateway.set_attrs(trial, {"options": options, "profiles": price.profiles, **assumed})
        return price

    def describe_late(self, run: TrialRun) -> bool:
        """A trial run undescribed (nothing to choose) ran out of memory: described now, for more micro-batches."""
        if run.waiting.price.workload is not None or self._pricer is None:
            return False
        run.waiting.price = self.price(run.waiting.trial, describe=True)
        return True

    def admit(
        self, trial: optuna.Trial, price: TrialPrice, asked_at: float, now: float, *, profile_everything: bool = False
    ) -> None:
        """A trial described and priced: it waits to be planned, or fails if no option fits it."""
        waiting = Waiting(
            trial,
            price,
            asked_at=asked_at,
            describe_seconds=now - asked_at,
            prices=[[-1, [p.option.to_json() for p in price.options]]],
        )
        if not price.options:
            self.fail(
                Fail(
                    waiting, "no strategy fits this trial on these devices (every option ran out of memory or failed)"
                ),
                now,
            )
            return
        self._state.admit(waiting)
        self._view.saw(waiting)
        if profile_everything:
            self._profiling.measure_every_option(trial, price)

    def reprice(self, taught: int | None) -> None:
        """Measurements came in (trial ``taught``'s run, or a profiling job): every waiting trial is priced again,
        and keeps the change in its price history (the simulator replays a sweep's prices from it)."""
        if self._pricer is None:
            return
        for waiting in self._state.waiting.values():
            waiting.price = self.price(waiting.trial, leaving=waiting.left, was=waiting.prices[-1][1])
            options = [p.option.to_json() for p in waiting.price.options]
            if not waiting.prices or waiting.prices[-1][1] != options:
                waiting.prices.append([taught, options])
        self._state.plan_dirty = True
        self._state.changes += 1

    # -- decisions --------------------------------------------------------------------------------------------------
    def planned(self, planned: Planned | None) -> None:
        self._state.plan_dirty = False
        if planned is None:
            return
        for number, place in planned.places.items():
            waiting = self._state.waiting[number]
            waiting.assignment = place
            waiting.planned_start, waiting.planned_end = planned.now + place.start, planned.now + place.end
        self._state.plan_order = sorted(planned.places, key=lambda n: (planned.places[n].start, n))
        self.events.send("on_plan", planned.shown, list(planned.places), planned.now)

    def start(self, start: Start, now: float) -> None:
        waiting, option, number, devices = start.waiting, start.option, start.waiting.number, start.devices
        if waiting.queued:
            trial = self.queue.take(waiting.trial)
            if trial is None:
                self._state.forget(number)
                _logger.info(f"Trial {number} was taken from the study's queue by another sweep; it runs there.")
                return
            self.own(trial)
            waiting.trial = trial
        waiting.assignment = replace(
            waiting.assignment,
            option=option,
            devices=devices,
            start=0.0,
            end=option.runtime,
            node=self._state.topology.node_of(devices[0]),
        )
        waiting.planned_start = min(waiting.planned_start, now)  # no later than planned, as long as it takes
        waiting.planned_end = waiting.planned_start + option.runtime
        request = self._requests.trial(waiting.trial, option, devices, self._state.resumes.get(number))
        run = TrialRun(request.key, devices, now, request.log, waiting=waiting, session=request.tasks[0].session)
        self._state.launched(run)
        self._pool.submit(request)
        names = [self._state.devices[i] for i in devices]
        _logger.info(reporting.started(number, option, names, waiting.price.option(option.choice), run.log))
        planned = (waiting.planned_start, waiting.planned_end)
        self.events.send("on_trial_start", TrialStart(number, option.strategy, tuple(map(str, names)), *planned, now))

    def measure(self, measure: Measure, now: float) -> None:
        request = self._requests.profiling(measure.job, measure.devices)
        sessions = {t.session.trial.number: t.session for t in request.tasks}
        self._state.launched(
            ProfileRun(request.key, measure.devices, now, request.log, job=measure.job, sessions=sessions)
        )
        self._pool.submit(request)
        for entry in measure.job.entries:
            for s in entry.strategies:
                name = reporting.option_name(s.name, measure.job)
                self.events.send("on_profile", ProfileEvent(entry.trial.number, name, "started"))

    def stop(self, stop: Stop) -> None:
        stop.run.stalled = stop.reason
        _logger.warning(f"Trial {stop.run.number}: {stop.reason}; stopping it.")
        self._pool.stop(stop.run.key, stop.reason)

    def request_move(self, move: RequestMove | None) -> None:
        if move is None:
            return
        move.run.session.move_requested = True
        self.events.send(
            "on_trial_move",
            TrialMove(
                move.run.number,
                move.run.waiting.assignment.option.label,
                move.target.label,
                "asked",
                summary=move.summary,
            ),
        )

    def fail(self, fail: Fail, now: float) -> None:
        """End a waiting trial FAIL with the reason (one still in the study's queue stays there)."""
        self._state.forget(fail.waiting.number)
        if fail.waiting.queued:
            _logger.warning(f"Trial {fail.waiting.number} stays in the study's queue: {fail.reason}.")
            return
        frozen = self.gateway.fail(fail.waiting.trial, fail.reason, attrs={"profiles": fail.waiting.price.profiles})
        _logger.warning(f"Trial {fail.waiting.number} failed: {fail.reason}.")
        self.after_trial(frozen, now)

    def nodes(self, joined: list, lost: set[int], now: float) -> bool:
        """Nodes joined (their devices are planned on from now) or were lost (no longer counted on: the trials
        planned there are planned again). Returns whether any device was lost."""
        state = self._state
        if not joined and lost <= state.lost:
            return False
        newly_lost = lost - state.lost
        if not state.nodes_changed([*state.devices, *joined], state.lost | lost, now):
            return False  # nothing left to plan on: the pool says so (PoolBroken) and the sweep ends
        for waiting in state.waiting.values():
            if waiting.assignment is not None and set(waiting.assignment.devices) & state.lost:
                waiting.assignment = None
        if newly_lost:
            _logger.warning(reporting.devices_lost(newly_lost, state))
        return bool(newly_lost)

    def relay_progress(self, run: TrialRun) -> None:
        session = run.session
        if session.step != run.reported_step:
            run.reported_step = session.step
            self.events.send(
                "on_trial_progress", TrialProgress(run.number, session.step, session.total_steps, session.step_seconds)
            )

    def learn_early(self, lessons: list[tuple[TrialRun, dict[str, Any]]]) -> None:
        """Running trials' steps so far, as their options' profiles: the waiting trials are priced again."""
        for run, lesson in lessons:
            option = run.waiting.assignment.option
            if self._pricer is not None and self._pricer.learn_from_run(run.number, option, early=True, **lesson):
                _logger.debug(  # (a sampled sweep's every trial may be a new workload: a line each)
                    f"Trial {run.number}'s first {lesson['steps']} steps measured {option.label}: "
                    f"{lesson['step_seconds']:.3g} s a step; the waiting trials are priced again."
                )
                self.reprice(run.number)

    # -- ends -------------------------------------------------------------------------------------------------------
    def leave_out(self, left: LeaveOut) -> bool:
        """Leave the option out for the trial's workload and plan the trial again (from its checkpoint, if every
        device reads it); False if no option is left (the trial then fails)."""
        run = left.run
        waiting, option = run.waiting, run.waiting.assignment.option
        if left.out_of_memory:
            self._pricer.mark_out_of_memory(run.number, option, left.error)
        else:
            self._pricer.mark_failed(run.number, option, left.error)
        self.resumes.from_run(run)
        price = self.price(waiting.trial, leaving=waiting.left)
        if not price.options:
            return False
        _logger.warning(
            f"Trial {run.number} failed under {option.label}, the first run of that option for its "
            f"workload ({left.error}); the option is left out and the trial is planned again."
        )
        self._state.admit(replace(waiting, price=price, assignment=None, attempts=waiting.attempts + 1))
        return True

    def continue_moved(self, run: TrialRun, now: float) -> None:
        """A trial stopped at its checkpoint to move: it waits again, to resume from that checkpoint under an
        option other than the one it left (the plan picks which), and stays RUNNING in the study meanwhile."""
        waiting, session, left = run.waiting, run.session, run.waiting.assignment.option
        self.resumes.from_run(run, moved=True)
        price = self.price(session.trial, leaving=left.choice)
        first_step = session.first_step_at
        moves = [
            *waiting.moves,
            {
                "from": left.label,
                "device_ids": list(run.devices),
                "started": round(run.started, 3),
                "at": round(now, 3),
                "at_step": int(session.checkpoint["step"]),
                "setup": round(first_step - self._state.started_at - run.started, 3)
                if first_step is not None
                else None,
            },
        ]
        self.gateway.set_attrs(session.trial, {"moves": moves})
        self._state.admit(
            replace(waiting, trial=session.trial, price=price, assignment=None, moves=moves, left=left.choice)
        )
        self.events.send("on_trial_move", TrialMove(run.number, left.label, "", "stopped", step=moves[-1]["at_step"]))

    def tell(self, tell: Tell, *, call_back: bool = True) -> bool:
        """End the trial in the study; returns whether its run taught the pricing something."""
        run, option = tell.run, tell.run.waiting.assignment.option
        frozen = self.gateway.tell(run.session.trial, tell.state, tell.values, attrs=tell.attrs, log=run.log)
        if frozen.state in (TrialState.COMPLETE, TrialState.PRUNED) and not self._keep_checkpoints:
            self._remove_checkpoints(run)
        seconds = tell.attrs["actual_runtime"]
        priced = run.waiting.price.option(option.choice)
        if frozen.state == TrialState.COMPLETE and not run.session.resumed_from:
            self._view.estimator.observe(option, seconds)
        if frozen.state in (TrialState.COMPLETE, TrialState.PRUNED):
            self._learn_survival(run, frozen.state)
        if (
            frozen.state != TrialState.FAIL
            and priced is not None
            and priced.record is not None
            and run.session.step_seconds is not None
        ):
            self._view.estimator.observe_step_rate(priced.record.step_seconds, run.session.step_seconds)
        learned = (
            tell.learn is not None
            and self._pricer is not None
            and self._pricer.learn_from_run(run.number, option, **tell.learn)
        )
        if tell.run_again and frozen.state == TrialState.FAIL and not ended_by_another(frozen):
            self._run_again(frozen)  # (one another sweep ended has been run again by it)
        reporting.log_finished(frozen, seconds, tell.reason, run.log)
        self.after_trial(frozen, tell.attrs["actual_end"], call_back=call_back)
        return learned

    def _learn_survival(self, run: TrialRun, state: TrialState) -> None:
        """How much of its steps the trial ran teaches what the others are expected to run (logged when the
        assumption moves by a tenth or more)."""
        survival, session = self._view.survival, run.session
        if survival.blind or (state == TrialState.PRUNED and not session.total_steps):
            return
        before = survival.expected_share()
        survival.saw(
            1.0 if state == TrialState.COMPLETE else session.step / session.total_steps,
            complete=state == TrialState.COMPLETE,
        )
        if abs(survival.expected_share() - before) >= 0.1:
            _logger.info(f"Trials are now {survival.describe()}.")

    def profile_ended(self, run: ProfileRun, end: JobEnd, now: float) -> None:
        """Store what a profiling job measured; what it did not reach is measured next."""
        names = [str(self._state.devices[i]) for i in run.devices]
        for number, where in self._profiling.ran(run, now, names).items():
            if number in self._state.waiting:
                self.gateway.set_attrs(self._state.waiting[number].trial, {"profiling": where})
        results, unreported = profile_results(
            {n: list(s.profiles) for n, s in run.sessions.items()},
            end,
            run.log,
            expected=sum(len(e.strategies) for e in run.job.entries),
        )
        recorded = self._pricer.record(run.job, results, self._state.started_at + run.started, unreported)
        follow_ups = self._pricer.follow_ups(run.job, recorded)
        self._profiling.follow_up(follow_ups)
        for entry, strategy, record in recorded:
            name, text = reporting.option_name(strategy.name, run.job), reporting.profiled(record, bool(follow_ups))
            log = _logger.warning if record is not None and record.failed else _logger.info
            log(f"Profiled {name} (trial {entry.trial.number}): {text}.")
            self.events.send("on_profile", ProfileEvent(entry.trial.number, name, "done", text))

    def after_trial(self, frozen: FrozenTrial, now: float, *, call_back: bool = True) -> None:
        """What follows every trial's end: the listeners, then Optuna's callbacks and ``gc_after_trial``, in this
        process, as ``study.optimize`` does (not for trials the sweep's own interruption ended)."""
        self.events.send("on_trial_end", frozen, now)
        if call_back:
            self.gateway.call_back(self._callbacks, frozen)
        self.queue.look_again()  # its params run again, or a callback enqueued trials: ahead of new trials
        if self._gc_after_trial:
            gc.collect()

    def _run_again(self, frozen: FrozenTrial) -> None:
        """A trial whose rank died or hung: its params run again next, resuming from its checkpoint if it saved
        one. ``n_trials`` still counts new trials."""
        run_again(self.gateway, frozen)
        if self._state.n_trials is not None:
            self._state.n_trials += 1
        _logger.warning(
            f"Trial {frozen.number}'s params run again as a new trial"
            + (" from its checkpoint." if ATTR + "checkpoint" in frozen.user_attrs else ".")
        )

    def _remove_checkpoints(self, run: TrialRun) -> None:
        """A trial that ended needs no checkpoint: neither its own nor the one it resumed from."""
        checkpoint.remove(self._requests.checkpoint_folder(run.number))
        resume = self._state.resumes.get(run.number)
        if resume is not None:
            checkpoint.remove(Path(resume.path).parent)
