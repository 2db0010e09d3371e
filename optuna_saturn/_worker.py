"""Entry point of every launched worker process: ``python -m optuna_saturn._worker SPEC.json``.

It pins the process to its device, joins the trial's process group, connects rank 0 to the executor, runs the
user's objective with a :class:`~optuna_saturn.trial.SaturnTrial`, and reports how it ended.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import NoReturn


def _pin_to_device(spec: dict, local_rank: int) -> dict:
    """Pin CPU affinity and thread counts before torch starts its thread pools."""
    device = spec["devices"][local_rank]
    if device["kind"] == "cpu" and device["cores"]:
        os.sched_setaffinity(0, device["cores"])
        os.environ["OMP_NUM_THREADS"] = str(len(device["cores"]))
    return device


def error_file(spec_path: str, rank: int) -> str:
    return f"{spec_path}.rank{rank}.error.json"


def _record_error(spec_path: str, rank: int, error: str) -> None:
    """Every rank leaves its error behind, so the executor can name the rank that failed first (the root
    cause), not the peers that failed because it went away."""
    with open(error_file(spec_path, rank), "w", encoding="utf-8") as f:
        json.dump({"rank": rank, "time": time.time(), "error": error}, f)


def main(spec_path: str) -> NoReturn:
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    device_json = _pin_to_device(spec, local_rank)

    os.environ["OPTUNA_SATURN_WORKER"] = "1"
    import optuna
    import torch
    import torch.distributed as dist

    from optuna_saturn._objective_ref import load_objective
    from optuna_saturn.channel import ChannelClient
    from optuna_saturn.engines import StrategyMismatch, WorkerContext, engine_for
    from optuna_saturn.engines import _clipping
    from optuna_saturn.microbatch import AccumulationError
    from optuna_saturn.strategy import Strategy
    from optuna_saturn.trial import ProfileComplete, SaturnTrial

    if device_json["kind"] == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group(backend="nccl", device_id=device)
        control_group = dist.new_group(backend="gloo")
    else:
        if device_json["cores"]:
            torch.set_num_threads(len(device_json["cores"]))
        device = torch.device("cpu")
        dist.init_process_group(backend="gloo")
        control_group = dist.group.WORLD

    channel = ChannelClient(spec["channel"], spec["token"]) if rank == 0 else None
    _clipping.install()  # before the objective's module imports clip_grad_norm_
    objective = load_objective(spec["objective"])
    profile = spec.get("profile")
    accumulation = int((profile or spec).get("gradient_accumulation", 1))

    def run(strategy_json: dict) -> dict:
        """Run the objective once under one strategy; how it ended, as the message rank 0 sends."""
        strategy = Strategy.from_json(strategy_json)
        context = WorkerContext(
            rank, local_rank, world_size, device, dict(strategy.knobs), dict(strategy.launcher_config), accumulation,
            control_group, strategy.name,
        )
        _clipping.forget_all()
        trial = SaturnTrial(
            number=spec["trial_number"], strategy=strategy, engine=engine_for(strategy.engine, context),
            channel=channel, control_group=control_group, profile=profile,
        )
        started_at = time.time()

        def measured(*, agreed: bool = True) -> dict:
            """A profiling run's outcome: the timed steps, the loops counted, and the objective's time after its
            last loop. ``agreed``: every rank got here the same way, so the slowest rank's numbers can be
            gathered; otherwise this rank's own (no collective: a peer may be inside one of the objective's)."""
            timings = trial.profile_timings
            tail = time.time() - timings.last_loop_ended_at
            world = world_size if agreed else 1
            return {
                "op": "profile", "strategy": strategy.name, "objective_started_at": started_at,
                **timings.to_json(),
                "step_seconds": _max_over_ranks(timings.step_seconds, world, control_group),
                "tail_seconds": _max_over_ranks([tail], world, control_group)[0],
                "peak_memory_bytes": _max_over_ranks([_peak_memory(device)], world, control_group)[0],
            }

        try:
            value = objective(trial)
            if trial.profile_timings is not None:
                return measured()
            values = [float(v) for v in value] if isinstance(value, (list, tuple)) else [float(value)]
            return {"op": "result", "values": values}
        except (optuna.TrialPruned, ProfileComplete) as exc:
            if trial.profile_timings is not None:
                return measured()
            return {"op": "pruned", "message": str(exc)}
        except BaseException as exc:  # the trial failed; the sweep goes on
            traceback.print_exc()
            error = f"{type(exc).__name__}: {exc}"
            out_of_memory = isinstance(exc, (torch.OutOfMemoryError, MemoryError))
            if trial.profile_timings is not None and not out_of_memory and not isinstance(exc, KeyboardInterrupt):
                # After a shortened loop, code that expects a full one may fail (e.g. min() of validation losses
                # that were never computed): the steps are still measured; the time after the loop is cut short.
                print("optuna-saturn: the error above came after the timed steps; the profile keeps them.",
                      file=sys.stderr)
                outcome = measured(agreed=False)
                if world_size > 1:  # peers may wait in a collective this rank left: end the launch
                    outcome["stop_launch"] = error
                return outcome
            if profile is not None and (out_of_memory or isinstance(exc, AccumulationError)):
                # an infeasible option, not a failure. Out of memory in the steps: more micro-batches may fit.
                oom_in_steps = (
                    trial.steps_started and trial.profile_timings is None and not isinstance(exc, AccumulationError)
                )
                return {
                    "op": "profile", "strategy": strategy.name, "infeasible": True, "oom_in_steps": oom_in_steps,
                    "error": error[:500],
                }
            if profile is not None:
                # This option cannot run this trial: it is never planned for it. A mismatch is raised by every rank
                # alike before any collective, so the launch goes on to its next strategy; a crash ends it.
                outcome = {"op": "profile", "strategy": strategy.name, "failed": True, "error": error[:2000]}
                if not isinstance(exc, StrategyMismatch):
                    _record_error(spec_path, rank, error)
                    outcome["stop_launch"] = error
                return outcome
            _record_error(spec_path, rank, error)
            return {"op": "fail", "error": error, "traceback": traceback.format_exc()}

    def send(outcome: dict) -> None:
        if channel is not None:
            channel.call(outcome["op"], **{k: v for k, v in outcome.items() if k != "op"})

    # One launch can time several strategies of the same launcher and device count: the launch is paid once.
    for strategy_json in profile["strategies"] if profile is not None else [spec["strategy"]]:
        outcome = run(strategy_json)
        send(outcome)
        # An out-of-memory stops the launch: the strategies after it need more memory (least memory first).
        ended = outcome["op"] == "fail" or "stop_launch" in outcome or outcome.get("infeasible")
        if ended:
            break
        _release_memory(device)
    if channel is not None:
        channel.close()
    if ended:
        _exit_now(1)  # peers may be stuck in a collective; the launcher stops them
    dist.barrier(group=control_group)  # without it gloo sometimes aborts in destroy_process_group
    dist.destroy_process_group()
    _exit_now(0)


def _release_memory(device: object) -> None:
    """Between two strategies timed in one launch, give back what the first one held."""
    import gc

    import torch

    gc.collect()
    if getattr(device, "type", "cpu") == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # Linux >= 4.0: reset the peak resident set ("high water mark") to the current one
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        pass  # then a later strategy's peak may include an earlier one's (an overestimate, never an under)


def _peak_memory(device: object) -> float:
    """Peak memory of this rank: allocated on the GPU, or this process's peak resident set on CPU."""
    import resource

    import torch

    if getattr(device, "type", "cpu") == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):  # peak resident set since the last reset
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def _max_over_ranks(values: list[float], world_size: int, group: object) -> list[float]:
    """Element-wise max over ranks: a step takes as long as its slowest rank."""
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64)
    if world_size > 1 and len(values):
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return tensor.tolist()


def _exit_now(code: int) -> NoReturn:
    """Exit while the trial's objects are still referenced. The outcome is already with the executor; letting
    Python free a DDP reducer can deadlock (its gloo thread wants the GIL the deallocation holds: seen here)
    and would keep the trial's devices busy for nothing."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1])
