"""One job in a worker process: the user's objective run as a trial, or timed as a profile, under a strategy, with
this process as one rank of the job's process group.

Both kinds of worker run jobs through here: a process a launcher started for one job (``optuna_saturn.worker.launched``)
and a warm worker that runs job after job (``optuna_saturn.worker.warm``). Rank 0 reports how each run ended to
the executor over the trial's channel; every rank leaves its error in a file, so the executor can name the rank
that failed first.
"""

from __future__ import annotations

import errno
import os
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

import optuna
import torch
import torch.distributed as dist

from optuna_saturn import raised
from optuna_saturn.channel import AuthenticationFailed, ChannelBusy, ChannelClient, ChannelClosed, RemoteError
from optuna_saturn.engines import StrategyMismatch, WorkerContext, _clipping, engine_for
from optuna_saturn.integrations import _guard as accelerate_guard
from optuna_saturn.strategy import Strategy
from optuna_saturn.training.checkpoint_paths import CheckpointNotWritten
from optuna_saturn.training.microbatch import AccumulationError
from optuna_saturn.training.trial_steps import ProfileComplete
from optuna_saturn.trial import SaturnTrial, TrialMoved
from optuna_saturn.worker.failures import CRASH, OUT_OF_MEMORY, error_kind, record_failure
from optuna_saturn.worker.gpu import rank_environment
from optuna_saturn.worker.memory import RunMemory, collect, release_memory


@dataclass(frozen=True)
class RankPlace:
    """Where this process stands in the job's process group. ``local_rank`` is the ordinal of the one device it sees
    (0: see :mod:`optuna_saturn.worker.gpu`)."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    control_group: Any  # gloo: small CPU-side collectives (relayed answers, timings)


def join_process_group(
    device_json: dict,
    rank: int,
    world_size: int,
    *,
    init_method: str | None = None,
    rendezvous_timeout: float | None = None,
    collective_timeout: float | None = None,
) -> RankPlace:
    """Join the job's process group: NCCL on a GPU (with a gloo group beside it), gloo on a CPU device.
    ``init_method`` (``file://PATH``) None: from the environment a launcher set (``MASTER_ADDR`` ...). The ranks
    wait for each other up to ``rendezvous_timeout``; a collective may take up to ``collective_timeout`` (a
    rank-0-only evaluation, say) before the process group gives up."""
    options: dict[str, Any] = {"rank": rank, "world_size": world_size}
    if collective_timeout is not None:
        options["timeout"] = timedelta(seconds=collective_timeout)
    if init_method is not None:
        os.environ.update(rank_environment(rank, world_size))  # what a launcher would have set
        store = dist.FileStore(init_method.removeprefix("file://"), world_size)
        if rendezvous_timeout is not None:
            store.set_timeout(timedelta(seconds=rendezvous_timeout))
        options["store"] = store
    if device_json["kind"] == "cuda":
        device = torch.device("cuda", 0)  # the one GPU this worker sees
        torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl", device_id=device, **options)
        control_group = dist.new_group(backend="gloo")
    else:
        device = torch.device("cpu")
        dist.init_process_group(backend="gloo", **options)
        control_group = dist.group.WORLD
    return RankPlace(rank, 0, world_size, device, control_group)


def leave_process_group(place: RankPlace) -> None:
    """After a job that ended the same way on every rank: what the job left is freed while its communicators
    still exist (NCCL's free hooks need them), then the process group goes."""
    collect(place.device)
    dist.barrier(group=place.control_group)  # without it gloo sometimes aborts in destroy_process_group
    dist.destroy_process_group()


def run_job(spec: dict, place: RankPlace, objective: Callable[[Any], Any]) -> bool:
    """Run ``spec``'s objective under its strategy, or, for a profiling job, each of its trials (``entries``) under
    each of their strategies in turn, and report each outcome. Returns whether the job ended alike on every rank,
    so that this process and its process group can be used again; False after a failure, an out-of-memory or a
    stopped launch (peers may be stuck in a collective, memory may be fragmented)."""
    for entry in spec.get("entries") or [spec]:
        channel = ChannelClient(entry["channel"], entry["token"]) if place.rank == 0 else None
        profile = entry.get("profile")
        accumulation = int((profile or entry).get("gradient_accumulation", 1))
        ended = False
        try:
            # One job can time several strategies of the same device count: the set-up is paid once.
            for strategy_json in profile["strategies"] if profile is not None else [entry["strategy"]]:
                outcome = _run_once(entry, place, objective, Strategy.from_json(strategy_json), accumulation, channel)
                if channel is not None:
                    channel.call(outcome["op"], **{k: v for k, v in outcome.items() if k != "op"})
                # An out-of-memory stops the job: the strategies after it need more memory (least memory first).
                ended = outcome["op"] == "fail" or "stop_launch" in outcome or bool(outcome.get("infeasible"))
                if ended:
                    break
                release_memory(place.device)
        finally:
            if channel is not None:
                channel.close()
        if ended:
            return False
    return True


def _run_once(
    spec: dict,
    place: RankPlace,
    objective: Callable[[Any], Any],
    strategy: Strategy,
    accumulation: int,
    channel: ChannelClient | None,
) -> dict:
    """Run the objective once under one strategy; how it ended, as the message rank 0 sends. Whatever the run
    built is let go before this returns (see :mod:`optuna_saturn.worker.memory`)."""
    context = WorkerContext(
        place.rank,
        place.local_rank,
        place.world_size,
        place.device,
        dict(strategy.knobs),
        dict(strategy.launcher_config),
        accumulation,
        place.control_group,
        strategy.name,
    )
    _clipping.forget_all()
    engine = engine_for(strategy.engine, context)
    trial = SaturnTrial(
        number=spec["trial_number"],
        strategy=strategy,
        engine=engine,
        channel=channel,
        control_group=place.control_group,
        profile=spec.get("profile"),
        checkpoint=spec.get("checkpoint"),
        known=spec.get("trial"),
    )
    try:
        return _outcome(spec, place, objective, trial, channel, engine.model_construction())
    finally:
        trial.release()


def _outcome(
    spec: dict,
    place: RankPlace,
    objective: Callable[[Any], Any],
    trial: SaturnTrial,
    channel: ChannelClient | None,
    model_construction: AbstractContextManager,
) -> dict:
    """How the objective ran. ``model_construction`` surrounds it (until ``trial.prepare``): under a sharding
    strategy, the model is cut as it is built (see :mod:`optuna_saturn.engines._sharded_build`)."""
    profile, strategy = spec.get("profile"), trial.strategy
    memory = RunMemory(place.device)
    started_at = time.time()
    if channel is not None:
        channel.call("started")

    def measured(*, agreed: bool = True) -> dict:
        """A profiling run's outcome: the timed steps, the loops counted, and the objective's time after its
        last loop. ``agreed``: every rank got here the same way, so the slowest rank's numbers can be gathered;
        otherwise this rank's own (no collective: a peer may be inside one of the objective's)."""
        timings = trial.profile_timings
        assert timings is not None  # (each caller checked it: the profiling run's timed loop ended)
        tail = time.time() - timings.last_loop_ended_at
        world = place.world_size if agreed else 1
        peak, reserved = _max_over_ranks([memory.peak(), memory.reserved_peak()], world, place.control_group)
        return {
            "op": "profile",
            "strategy": strategy.name,
            "objective_started_at": started_at,
            **timings.to_json(),
            "step_seconds": _max_over_ranks(timings.step_seconds, world, place.control_group),
            "tail_seconds": _max_over_ranks([tail], world, place.control_group)[0],
            "peak_memory_bytes": peak,
            "reserved_memory_bytes": reserved,
        }

    me = os.getpid()
    try:
        try:
            with accelerate_guard.running(trial), model_construction:
                value = objective(trial)
        finally:
            if os.getpid() != me:  # a fork the objective made returned from it too: it must not act as this rank
                exit_now(0)
        if trial.profile_timings is not None:
            return measured()
        values = [float(v) for v in value] if isinstance(value, (list, tuple)) else [float(value)]
        return {"op": "result", "values": values}
    except (optuna.TrialPruned, ProfileComplete) as exc:
        if trial.profile_timings is not None:
            return measured()
        return {"op": "pruned", "message": str(exc)}
    except TrialMoved as exc:  # the executor goes on with it elsewhere, from the checkpoint just saved
        return {"op": "moved", "step": exc.step}
    except BaseException as exc:  # the trial failed; the sweep goes on
        traceback.print_exc()
        error = f"{type(exc).__name__}: {exc}"
        kind = error_kind(exc, world_size=place.world_size)
        out_of_memory = kind == OUT_OF_MEMORY
        if trial.profile_timings is not None and not out_of_memory and not isinstance(exc, KeyboardInterrupt):
            # After a shortened loop, code that expects a full one may fail (e.g. min() of validation losses that
            # were never computed): the steps are still measured; the time after the loop is cut short.
            print("optuna-saturn: the error above came after the timed steps; the profile keeps them.", file=sys.stderr)
            outcome = measured(agreed=False)
            if place.world_size > 1:  # peers may wait in a collective this rank left: end the job
                outcome["stop_launch"] = error
            return outcome
        # Out of memory once the steps began: more micro-batches may fit (not while the model is prepared).
        in_steps = trial.steps_started and trial.profile_timings is None and not isinstance(exc, AccumulationError)
        if profile is not None and (out_of_memory or isinstance(exc, AccumulationError)):
            # an infeasible option, not a failure; this rank says so even if it is not rank 0, whose report may
            # never come (it waits for this one in a collective until it is stopped)
            if out_of_memory:
                record_failure(
                    spec["errors"],
                    place.rank,
                    error,
                    kind,
                    in_steps=in_steps,
                    strategy=strategy.name,
                    trial=trial.number,
                )
            return {
                "op": "profile",
                "strategy": strategy.name,
                "infeasible": True,
                "oom_in_steps": in_steps,
                "error": error[:500],
            }
        if profile is not None:
            # This option cannot run this trial: it is never planned for it. A mismatch is raised by every rank
            # alike before any collective, so the job goes on to its next strategy; a crash ends it.
            outcome = {"op": "profile", "strategy": strategy.name, "failed": True, "error": error[:2000]}
            if not isinstance(exc, StrategyMismatch):
                record_failure(spec["errors"], place.rank, error, kind, strategy=strategy.name, trial=trial.number)
                outcome["stop_launch"] = error
            return outcome
        record_failure(
            spec["errors"], place.rank, error, kind, in_steps=in_steps, strategy=strategy.name, trial=trial.number
        )
        outcome = {"op": "fail", "error": error, "kind": kind, "traceback": traceback.format_exc()}
        if kind == CRASH and not isinstance(exc, _MACHINERY_ERRORS) and not _disk_full(exc):
            outcome["raised"] = raised.record(exc)  # the objective's own: study.optimize's catch applies to it
        return outcome


#: Errors a run's code sees that come from the sweep's machinery, not from the objective: a collective that timed
#: out or lost its peer, the channel to the executor closed or refusing, the executor failing to answer, the disk
#: refusing the trial's checkpoint.
_MACHINERY_ERRORS = (
    dist.DistError,
    ChannelClosed,
    AuthenticationFailed,
    ChannelBusy,
    RemoteError,
    CheckpointNotWritten,
)


def _disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a full disk or quota: a log or file write of the trial that the disk
    refused ends that trial alone, with the reason, as a checkpoint does; the sweep goes on (issue 47, N2)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        current = current.__cause__ or current.__context__
    return False


def _max_over_ranks(values: list[float], world_size: int, group: Any) -> list[float]:
    """Element-wise max over ranks: a step takes as long as its slowest rank."""
    tensor = torch.tensor(values, dtype=torch.float64)
    if world_size > 1 and len(values):
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return tensor.tolist()


def exit_now(code: int) -> NoReturn:
    """Exit while the job's objects are still referenced. The outcome is already with the executor; letting
    Python free a DDP reducer after a failure can deadlock (its gloo thread wants the GIL the deallocation holds:
    seen here) and would keep the job's devices busy for nothing."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
