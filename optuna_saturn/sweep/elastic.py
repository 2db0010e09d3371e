"""The elastic policy: moving a running trial to another option at its next checkpoint, when the sweep then ends
sooner by more than twice what the move costs (the plan does not foresee prunes).

The rule itself is the planner's (:func:`~optuna_saturn.planner.best_resize`, pure); this policy turns running
trials into what that rule needs, once a device freed or a running trial checkpointed, with at most one move
pending at a time. A trial may move only once it has saved a checkpoint in this run (the
proof that its objective checkpoints, and what it resumes from), to options that can load that checkpoint, at
most ``MAX_MOVES`` times. It is stopped right after its next checkpoint (``trial.checkpoint`` answers "stop"), so
no step is lost; the cost of the move is what the trial waits and pays meanwhile, measured on its own run:

- half the interval between its checkpoints (the next one comes, on average, that much later, while the
  devices it moves to may wait);
- saving that checkpoint and loading it back (its last save, twice);
- its run's start-up (from its launch to its first step: a new process group, the objective's set-up).

Only trials whose checkpoints are ``torch.distributed.checkpoint``s move (single, DDP, FSDP): DeepSpeed's does
not reshard, and one ZeRO stage's does not load into another.

``simulator.simulate(resize_seconds=...)`` and ``benchmarks/elastic_resize.py`` measure the rule under noise and
prunes, on the real loop; ``benchmarks/README.md`` has the figures.
"""

from __future__ import annotations

from collections.abc import Sequence

from optuna_saturn.planner import Job, Option, Plan, WorkLimit, best_resize, remaining_job
from optuna_saturn.study.trial_session import TrialSession
from optuna_saturn.sweep.decisions import Moved, RequestMove
from optuna_saturn.sweep.options import OptionsView
from optuna_saturn.sweep.planning import REPLAN_SECONDS, URGENT_SOLVER, work_limit
from optuna_saturn.sweep.policy import Decisions, Ending, Policy, Round
from optuna_saturn.sweep.state import SweepState, TrialRun
from optuna_saturn.training import checkpoint


class Elastic(Policy):
    """Whether to move a running trial now (see the module's docstring). Its own memory, written by its own methods
    only: whether moves are due (:meth:`job_ended`, :meth:`move`)."""

    def __init__(
        self,
        *,
        enabled: bool,
        engines: dict[str, str],
        max_moves: int = 2,
        seed: int = 0,
        plan_work: WorkLimit | None = None,
    ) -> None:
        self._enabled = enabled
        self._seed = seed
        self._work_limit = work_limit(plan_work)  # (None: its plans stop at REPLAN_SECONDS, as the sweep's do)
        self._engines = engines  # strategy -> its engine (what its checkpoint is)
        self._max_moves = max_moves  # per trial (a plan's estimates are noisy: no ping-pong on them)
        self._due = False  # a job ended since moves were last weighed
        self._checkpoints_seen = 0  # checkpoints the running trials had saved when moves were last weighed

    def on_end(self, ending: Ending) -> Decisions:
        """Any job's end makes moves due; a trial that stopped at its checkpoint to move waits again."""
        self.job_ended()
        run = ending.trial_run
        if run is None or ending.reason or (run.session.outcome or {}).get("op") != "moved":
            return []
        ending.settle(taught=True)
        return [self.moved(run, ending.now, ending.state.started_at)]

    def on_round(self, round: Round) -> Decisions:
        move = self.move(round.state, round.view, round.now)
        return [move] if move is not None else []

    def job_ended(self) -> None:
        self._due = True

    @staticmethod
    def moved(run: TrialRun, now: float, started_at: float) -> Moved:
        """``run`` stopped at its checkpoint to move: it waits again, with this move added to its record (where it
        ran, when it stopped, at which step, and its run's set-up, which its next move will pay again)."""
        session, first_step = run.session, run.session.first_step_at
        setup = None if first_step is None else round(first_step - started_at - run.started, 3)
        assert session.checkpoint is not None  # (it moves from the checkpoint it saved to move)
        move = {
            "from": run.assignment.option.label,
            "device_ids": list(run.devices),
            "started": round(run.started, 3),
            "at": round(now, 3),
            "at_step": int(session.checkpoint["step"]),
            "setup": setup,
        }
        return Moved(run, [*run.waiting.moves, move])

    def move(self, state: SweepState, view: OptionsView, now: float) -> RequestMove | None:
        if not self._enabled:
            return None
        runs = state.trial_runs()
        checkpoints = sum(len(r.session.checkpoint_steps) for r in runs)
        due = self._due or (checkpoints != self._checkpoints_seen and bool(state.free()))
        self._checkpoints_seen = checkpoints
        if not due or any(r.session.move_requested for r in runs):
            return None
        self._due = False
        movable, costs = {}, {}
        for run in runs:
            if len(run.waiting.moves) >= self._max_moves or run.session.checkpoint is None:
                continue
            session = run.session
            progress = min(session.step / session.total_steps, 1.0) if session.total_steps else None
            choice = run.assignment.option.choice
            options = view.options(run.waiting, state, progress=progress, keep=choice)  # (past a rung it may grow)
            current = next((o for o in options if o.choice == choice), None)
            if current is None:
                continue
            first_step = run.session.first_step_at
            startup = (first_step - state.started_at - run.started) if first_step else 0.0
            costs[run.key] = move_cost_seconds(run.session, startup)
            rest = rest_of_run(
                run.key,
                run.session,
                options,
                current,
                view.remaining(run, state, now),
                engines=self._engines,
                cost=costs[run.key],
            )
            if rest is not None:
                movable[run.key] = rest
        if not movable:
            return None
        jobs, busy = view.jobs_and_busy(state, now)
        previous = [state.topology.to_local(w.assignment) for w in state.waiting.values() if w.assignment]
        move = best_resize(
            jobs,
            state.cluster,
            busy=busy,
            movable=movable,
            previous=Plan(tuple(previous)) if previous else None,
            solver=URGENT_SOLVER,
            time_limit=REPLAN_SECONDS,
            min_gain=costs,
            seed=self._seed,
            work_limit=self._work_limit,
        )
        if move is None:
            return None
        moving = state.running[move.job]
        assert isinstance(moving, TrialRun)  # (only trials' runs are movable)
        return RequestMove(
            moving,
            move.plan.for_job(move.job).option,
            f"the plan then ends in {move.makespan:.0f} s instead of {move.kept_makespan:.0f} s "
            f"(the move costs about {costs[move.job]:.1f} s)",
        )


def move_cost_seconds(session: TrialSession, startup_seconds: float) -> float:
    """Seconds a move costs this run (see the module's docstring)."""
    steps = session.checkpoint_steps
    interval_steps = steps[-1] - steps[-2] if len(steps) >= 2 else steps[-1] - session.resumed_from if steps else 0
    wait = 0.5 * max(interval_steps, 0) * (session.step_seconds or 0.0)
    return wait + 2 * session.checkpoint_seconds + max(startup_seconds, 0.0)


def rest_of_run(
    name: str,
    session: TrialSession,
    options: Sequence[Option],
    current: Option,
    remaining_seconds: float,
    *,
    engines: dict[str, str],
    cost: float,
) -> Job | None:
    """The rest of a running trial as a job to plan under its other options (those that can load its latest
    checkpoint), or None if it may not move. ``options`` are its options as planned (``current`` among them),
    ``remaining_seconds`` what its own option still needs at its measured step rate: another option is expected
    to need that times its runtime over the current one's, plus ``cost``."""
    if session.checkpoint is None or session.move_requested or not current.runtime > 0:
        return None
    record = checkpoint.CheckpointRecord.from_json(session.checkpoint)
    if record.format != checkpoint.DCP:  # DeepSpeed's reshards only into its own ZeRO stage, by a conversion: kept
        return None
    able = [o for o in options if checkpoint.can_resume(record, engines[o.strategy], o.devices)]
    return remaining_job(
        name, able, current=current.choice, left=1.0, rate=remaining_seconds / current.runtime, restart=cost
    )
