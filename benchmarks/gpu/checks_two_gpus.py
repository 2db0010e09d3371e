"""The two-GPU parts of the GPU check (the GPU review's M1-M4; issue 46), for the day a machine of two GPUs is lent.
On fewer than two GPUs the runner says SKIP with the reason; the dry run makes them on two CPU devices over gloo.

- M1: a trial placed on GPU 1 runs there: its mask is the pool's entry for GPU 1, its current device 0,
  ``LOCAL_RANK`` "0", and the GPU CUDA shows it (its UUID) is GPU 1's as nvidia-smi names it.
- M2: out of memory on rank 1 alone under NCCL (rank 0 waits in the gradient all-reduce): the trial ends FAIL
  with rank 1's out of memory as its reason, is not run again as it was, and nothing hangs.
- M3: NCCL all-reduce bandwidth between two workers that each see one GPU (NCCL connects GPUs it cannot see), and
  where each rank ran.
- M4: a rank killed (SIGKILL) while its peer is inside an all-reduce: the trial ends FAIL with a reason within
  ``KILLED_ENDS_WITHIN`` seconds (not the collective's 30-minute time-out), and the next two-rank trial on the same
  GPUs runs COMPLETE.
"""

from __future__ import annotations

import os
import time

from checks_common import DRY, check, cuda, executor, expected_entry, part_work, placement_problems, smi

#: M4: a killed rank's trial must end within this many seconds of the kill.
KILLED_ENDS_WITHIN = 90.0
#: M3: below this bus bandwidth (GB/s) the ranks are not talking over the GPUs' links (NVLink, PCIe peer-to-peer,
#: or at worst host shared memory) but over sockets: a FAIL on GPUs; the dry run's gloo figure is INFO.
LEAST_GPU_BUS_GB_PER_S = 5.0


def _two() -> object:
    """The two devices: GPUs 0 and 1, or two CPU devices in the dry run."""
    return [0, 1] if cuda() else 2


def _second_device() -> object:
    """Device 1 alone: GPU 1, or the second CPU device in the dry run."""
    if cuda():
        return [1]
    from optuna_saturn.devices import cpu_devices

    return [cpu_devices(2)[1]]


def _ranks_placed(trial) -> list[str]:
    ranks = trial.user_attrs.get("ranks") or []
    problems = [] if len(ranks) == 2 else [f"{len(ranks)} ranks recorded"]
    for rank in ranks:
        problems += [f"rank {rank['rank']}: {p}" for p in placement_problems([rank], expected_entry(rank["rank"]))]
    return problems


# -- M1 ---------------------------------------------------------------------------------------------------------
def m1() -> bool:
    import optuna
    import two_gpu_objectives

    study = optuna.create_study()
    executor("M1", devices=_second_device(), strategies=["single"], profile=False).optimize(
        study, two_gpu_objectives.placement, n_trials=1
    )
    trial = study.trials[0]
    ranks = trial.user_attrs.get("ranks") or [{}]
    problems = placement_problems(ranks, expected_entry(1))
    if cuda():
        uuids = smi("uuid")
        seen = ranks[0].get("uuid") or "?"
        if len(uuids) < 2 or not uuids[1].endswith(seen):
            problems.append(f"its GPU's UUID {seen} is not GPU 1's ({uuids[1:2]})")
    if trial.state.name != "COMPLETE":
        problems.append(f"{trial.state.name}: {trial.system_attrs.get('saturn:fail_reason', '')[:200]}")
    return check(
        "M1",
        "FAIL" if problems else "PASS",
        f"a trial on device 1: {trial.state.name} on {ranks[0].get('device')}, mask {ranks[0].get('visible')!r} "
        f"(entry {expected_entry(1)!r}), LOCAL_RANK {ranks[0].get('local_rank_env')!r}, current device "
        f"{ranks[0].get('current_device')}, UUID {ranks[0].get('uuid')} {'; '.join(problems)}",
    )


# -- M2 ---------------------------------------------------------------------------------------------------------
def m2() -> bool:
    import optuna
    import two_gpu_objectives

    study = optuna.create_study()
    started = time.monotonic()
    executor("M2", devices=_two(), strategies=["ddp"], profile=False).optimize(
        study, two_gpu_objectives.out_of_memory_on_rank_1, n_trials=1
    )
    seconds = time.monotonic() - started
    reason = study.trials[0].system_attrs.get("saturn:fail_reason", "")
    problems = [] if len(study.trials) == 1 else [f"run again as it was: {len(study.trials)} trials"]
    if study.trials[0].state.name != "FAIL" or not reason.startswith("rank 1: OutOfMemoryError"):
        problems.append(f"{study.trials[0].state.name}, not FAIL for rank 1's out of memory")
    return check(
        "M2",
        "FAIL" if problems else "PASS",
        f"rank 1 out of memory under {'NCCL' if cuda() else 'gloo'}: {study.trials[0].state.name} in {seconds:.0f} s, "
        f"reason {reason[:160]!r} {'; '.join(problems)}",
    )


# -- M3 ---------------------------------------------------------------------------------------------------------
def m3() -> bool:
    import optuna
    import two_gpu_objectives

    if DRY:
        os.environ["REVIEW_ALL_REDUCE_MIB"] = "16"
    study = optuna.create_study()
    executor("M3", devices=_two(), strategies=["ddp"], profile=False).optimize(
        study, two_gpu_objectives.all_reduce_bandwidth, n_trials=1
    )
    trial = study.trials[0]
    problems = _ranks_placed(trial)
    if trial.state.name != "COMPLETE":
        problems.append(f"{trial.state.name}: {trial.system_attrs.get('saturn:fail_reason', '')[:200]}")
    ok = check("M3", "FAIL" if problems else "PASS", f"two ranks, one GPU each: {'; '.join(problems) or 'placed'}")
    bandwidth = trial.user_attrs.get("bus_gb_per_s")
    slow = cuda() and (bandwidth is None or bandwidth < LEAST_GPU_BUS_GB_PER_S)
    return ok & check(
        "M3",
        "FAIL" if slow else "INFO",
        f"all-reduce of {os.environ.get('REVIEW_ALL_REDUCE_MIB', '256')} MiB over {trial.user_attrs.get('backend')}: "
        f"bus bandwidth {bandwidth} GB/s (a GPU's FAIL under {LEAST_GPU_BUS_GB_PER_S:g})",
    )


# -- M4 ---------------------------------------------------------------------------------------------------------
def m4() -> bool:
    import optuna
    import two_gpu_objectives

    mark = part_work("M4") / "killed-at"
    os.environ["REVIEW_KILL_MARK"] = str(mark)
    study = optuna.create_study()
    study.enqueue_trial({"kill": 1})
    study.enqueue_trial({"kill": 0})
    executor("M4", devices=_two(), strategies=["ddp"], profile=False, max_retries=0).optimize(
        study, two_gpu_objectives.killed_mid_collective, n_trials=2
    )
    killed, after = study.trials[0], study.trials[-1]
    killed_at = float(mark.read_text()) if mark.exists() else None
    ended = killed.datetime_complete.timestamp() - killed_at if killed_at and killed.datetime_complete else None
    problems = [] if killed_at else ["rank 1 was never killed"]
    if killed.state.name != "FAIL" or ended is None or ended > KILLED_ENDS_WITHIN:
        problems.append(f"the killed trial {killed.state.name}, ended {ended} s after the kill")
    if len(study.trials) != 2 or after.state.name != "COMPLETE":
        problems.append(f"the next trial: {[t.state.name for t in study.trials]}")
    seconds = f"{ended:.1f}" if ended is not None else "?"
    return check(
        "M4",
        "FAIL" if problems else "PASS",
        f"rank 1 killed mid-all-reduce: its trial {killed.state.name} {seconds} s after, reason "
        f"{killed.system_attrs.get('saturn:fail_reason', '')[:140]!r}; the next trial {after.state.name} "
        f"{'; '.join(problems)}",
    )
