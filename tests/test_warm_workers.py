"""Warm workers: one process per device for the whole sweep, clean for every job, replaced when it is not."""

from __future__ import annotations

import itertools
import os
import statistics

import objectives
import optuna
import psutil
import pytest
import torch
from optuna.trial import TrialState
from support import require

from optuna_saturn import SaturnExecutor
from optuna_saturn.devices import Device, available_cores
from optuna_saturn.pools import forked_host
from optuna_saturn.pools.forked_host import why_not_fork

pytestmark = pytest.mark.launch


def test_a_reused_worker_starts_every_trial_clean(saturn_options):
    study = optuna.create_study()
    SaturnExecutor(devices=1, strategies=["single"], **saturn_options).optimize(
        study, objectives.leaves_a_mess, n_trials=3
    )
    found = [t.user_attrs["found"] for t in study.trials]
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    assert len({f["pid"] for f in found}) == 1  # one warm worker ran all three
    first = found[0]
    assert first["dtype"] == "torch.float32" and first["env"] is None and first["grad"] is True
    assert first["world"] == 1  # the trial's own process group, set up for it
    for later in found[1:]:  # what the previous trial changed is gone
        assert later == first
    logs = list(saturn_options["log_dir"].rglob("*.log"))
    assert len(logs) >= 4  # the host's, the worker's, the trials'
    assert {oct(log.stat().st_mode & 0o777) for log in logs} == {oct(0o600)}, "logs are their user's alone"
    assert {oct(log.parent.stat().st_mode & 0o777) for log in logs} == {oct(0o700)}


def test_a_worker_is_replaced_after_an_out_of_memory(saturn_options):
    study = optuna.create_study()
    SaturnExecutor(devices=1, strategies=["single"], **saturn_options).optimize(study, objectives.oom_first, n_trials=3)
    states = [t.state for t in study.trials]
    assert states == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    assert "OutOfMemoryError" in study.trials[0].system_attrs["saturn:fail_reason"]
    pids = [t.user_attrs["pid"] for t in study.trials]
    assert pids[1] != pids[0] and pids[2] == pids[1]  # a fresh worker after the out-of-memory, reused after


def test_trials_that_run_out_of_memory_one_after_another_do_not_end_the_pool(saturn_options):
    """Each out-of-memory replaces its worker moments after the worker started; that is not a worker failing to
    start (which the host gives up on after three): the sweep goes on."""
    study = optuna.create_study()
    SaturnExecutor(devices=1, strategies=["single"], profile=False, **saturn_options).optimize(
        study, objectives.oom_three_times, n_trials=5
    )
    assert [t.state for t in study.trials] == [TrialState.FAIL] * 3 + [TrialState.COMPLETE] * 2


def test_ddp_on_warm_workers_trains_exactly_like_a_launched_ddp(saturn_options, tmp_path):
    """The same DDP trial: on warm workers (a fresh process group on reused processes), and under `accelerate
    launch` (processes started for it): the same loss curve."""
    folder = tmp_path / "strategies"
    folder.mkdir()
    (folder / "ddp-launched.toml").write_text(
        'name = "ddp-launched"\nlauncher = "accelerate"\nengine = "ddp"\nmin_devices = 2\n'
    )
    curves = {}
    for name in ("ddp", "ddp-launched"):
        study = optuna.create_study()
        for _ in range(2):  # the second DDP trial reuses the warm workers
            study.enqueue_trial({})
        SaturnExecutor(devices=2, strategies=[name], strategy_folders=[folder], **saturn_options).optimize(
            study, objectives.same_curve, n_trials=2
        )
        assert all(t.state == TrialState.COMPLETE for t in study.trials), name
        curves[name] = [t.user_attrs["losses"] for t in study.trials]
    for warm, launched in zip(curves["ddp"], curves["ddp-launched"]):
        assert warm == pytest.approx(launched, rel=1e-4)
    assert curves["ddp"][0] == pytest.approx(curves["ddp"][1], rel=1e-6)  # a reused worker computes the same


def test_no_device_idles_while_a_trial_could_be_asked(saturn_options):
    """One long trial and short ones on two devices: while the long one runs, the other device goes from short
    trial to short trial with no gap beyond the hand-over (trials are asked as a device is about to free)."""
    study = optuna.create_study()
    for seconds in (6.0, 1.0, 1.0, 1.0, 1.0, 1.0):
        study.enqueue_trial({"seconds": seconds})
    SaturnExecutor(devices=2, strategies=["single"], **saturn_options).optimize(study, objectives.sleeps, n_trials=6)
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    by_device: dict[str, list] = {}
    for t in study.trials:
        by_device.setdefault(t.system_attrs["saturn:devices"][0], []).append(t.system_attrs)
    long_device = next(d for d, runs in by_device.items() if any(r["saturn:actual_runtime"] > 5 for r in runs))
    short = sorted(
        (r for d, rs in by_device.items() if d != long_device for r in rs), key=lambda r: r["saturn:actual_start"]
    )
    assert len(short) >= 3  # the short trials went to the free device, one after another
    gaps = [b["saturn:objective_start"] - a["saturn:actual_end"] for a, b in itertools.pairwise(short)]
    # hand-overs take milliseconds (benchmarks/dispatch_overhead.py); the bounds leave room for a loaded CI machine
    assert statistics.median(gaps) < 0.5 and max(gaps) < 2.0, gaps


def test_with_nothing_to_choose_a_trial_is_asked_once_its_device_is_free_as_plain_optuna_asks(saturn_options):
    """One device: a sampled trial has one option, so nothing is described before it runs and nothing is asked
    ahead (trials of a runtime it predicts well would otherwise be asked before the last one ended). The next
    trial is asked after the last one was told, as ``study.optimize``'s thread asks (TPE sees every result plain
    Optuna would). (It is described once its device runs it, so its run still teaches the profile store:
    tests/test_profiler.py.)"""
    import gpu_objectives

    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=1))
    SaturnExecutor(devices=1, strategies=["single", "ddp"], **saturn_options).optimize(
        study, gpu_objectives.steady, n_trials=3
    )
    trials = [t.system_attrs for t in study.trials]
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    for before, after in itertools.pairwise(trials):
        assert after["saturn:asked_at"] >= before["saturn:actual_end"], (before, after)
    assert study.user_attrs["saturn:last_sweep"]["profiling_runs"] == 0


def test_the_sampler_never_sees_more_trials_in_flight_than_plain_optuna_would(saturn_options):
    """Two devices, options to choose from: a trial is asked only while fewer trials are asked and not yet told
    than there are devices, as under ``study.optimize(n_jobs=2)`` (a thread asks once its trial was told); asking
    ahead while both devices run would show the sampler three."""
    import gpu_objectives

    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=2))
    SaturnExecutor(devices=2, strategies=["single", "ddp"], **saturn_options).optimize(
        study, gpu_objectives.steady, n_trials=6
    )
    runs = [t.system_attrs for t in study.trials]
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    for run in runs:
        asked = run["saturn:asked_at"]
        others = [r for r in runs if r["saturn:asked_at"] < asked and r["saturn:actual_end"] > asked]
        assert len(others) <= 1, (asked, [(r["saturn:asked_at"], r["saturn:actual_end"]) for r in others])


def test_with_nothing_to_choose_a_trial_that_runs_out_of_memory_still_gets_more_micro_batches(saturn_options):
    """An undescribed trial runs out of memory: it is described then, planned again with more micro-batches until
    one fits, and every later trial is described before it runs, so it starts with as many as its workload
    needs (no out-of-memory again)."""
    study = optuna.create_study()
    SaturnExecutor(devices=1, strategies=["single"], **saturn_options).optimize(
        study, objectives.needs_small_micro_batches, n_trials=2
    )
    first, second = (t.system_attrs for t in study.trials)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    assert first["saturn:gradient_accumulation"] == second["saturn:gradient_accumulation"] == 4
    assert [o.get("gradient_accumulation", 1) for o in second["saturn:options"]] == [4]  # planned so at once
    assert "prices" not in second  # (its price never changed: it never ran out of memory)


@pytest.mark.parametrize("host", ["fork of the executor", "fork, OpenMP released", "fresh interpreter"])
def test_the_pool_host_is_a_fork_of_the_executor_only_where_that_is_safe(saturn_options, monkeypatch, host):
    """This process runs an OpenMP parallel region first (a fork of it would hang in one of its own): workers of
    one thread are still forked from it, with no hang; workers of several threads are forked once this process's
    OpenMP thread pool is released, and come from a fresh interpreter where it cannot be. Either way the host is
    inside its own loopback-only namespace and a collective across workers works."""
    cores = available_cores()
    require(len(cores) >= 2, "a second core", fix="run it on a machine with 2 cores or more")
    if host == "fork of the executor":  # two devices of one core each
        devices = [Device("cpu", 0, (cores[0],)), Device("cpu", 1, (cores[1],))]
    else:  # one device of several cores
        devices = [Device("cpu", 0, tuple(cores))]
    if host == "fresh interpreter":  # an OpenMP runtime older than 5.0
        monkeypatch.setattr(forked_host, "release_openmp_threads", lambda: False)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        (torch.randn(2_000_000) * 2).exp().sum()  # this process's OpenMP thread pool now exists
    finally:
        torch.set_num_threads(threads)
    assert (why_not_fork(devices) is None) == (host != "fresh interpreter")

    study = optuna.create_study()
    SaturnExecutor(devices=devices, strategies=["single", "ddp"], **saturn_options).optimize(
        study, objectives.where_it_runs, n_trials=2
    )
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    for trial in study.trials:
        found = trial.user_attrs["host"]
        assert trial.value == trial.system_attrs["saturn:num_devices"]  # the all_reduce over its ranks
        assert found["net"] != os.readlink("/proc/self/ns/net")
        # What was imported before the fork is out of the collector's sight: a collection between jobs (and
        # Python's own, during a trial) walks only what jobs made, not torch's 150,000 objects again.
        assert found["gc_frozen"] > 100_000 and found["gc_tracked"] < found["gc_frozen"] / 4
        if host == "fresh interpreter":
            assert "optuna_saturn.pools.warm_host" in found["cmdline"]
        else:
            assert found["cmdline"] == psutil.Process().cmdline()
        assert found["threads"] == len(devices[0].cores)


def test_why_not_fork_names_the_reason():
    assert why_not_fork([Device("cpu", 0, (0,)), Device("cpu", 1, (1,))]) is None
    assert why_not_fork([Device("cuda", 0), Device("cuda", 1)]) is None  # CUDA is not initialised here
    assert why_not_fork([Device("cpu", 0, (0, 1))]) is None  # (its OpenMP thread pool, if any, released)
    # A thread of the user's (a database poller, say) may hold a lock the fork would keep locked for ever: the host
    # hung before it started a worker (a test that watched the study from a thread met it, once in a full run).
    import threading

    stop = threading.Event()
    theirs = threading.Thread(target=stop.wait, name="user-poller")
    theirs.start()
    try:
        assert "other threads (user-poller)" in why_not_fork([Device("cpu", 0, (0,))])
    finally:
        stop.set()
        theirs.join()
    assert why_not_fork([Device("cpu", 0, (0,))]) is None


@pytest.mark.launch
@pytest.mark.timeout(120)
def test_threads_after_openmp_in_the_executor_does_not_hang(saturn_options):
    """A CI run hung: its pytest process had run OpenMP regions, the pool host was forked from it (devices of one
    core each), and ``threads`` widened a forked worker to two threads, whose first parallel region hung (GNU
    OpenMP's pool does not survive a fork). The executor now releases its OpenMP thread pool before it forks."""
    cores = available_cores()
    require(len(cores) >= 2, "a second core", fix="run it on a machine with 2 cores or more")
    devices = [Device("cpu", 0, (cores[0],)), Device("cpu", 1, (cores[1],))]
    assert why_not_fork(devices, one_process=True) is None  # the host is a fork (the region below comes after)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        (torch.randn(2_000_000) * 2).exp().sum()  # this process's OpenMP thread pool now exists
    finally:
        torch.set_num_threads(threads)
    study = optuna.create_study()
    SaturnExecutor(devices=devices, strategies=["threads"], profile=False, **saturn_options).optimize(
        study, objectives.same_curve, n_trials=1
    )
    facts = study.trials[0].user_attrs.get("facts", {})
    assert study.trials[0].state == optuna.trial.TrialState.COMPLETE, study.trials[0].user_attrs
    assert (facts["processes"], facts["threads"]) == (1, 2)


def test_an_openmp_pool_that_cannot_be_released_is_not_forked(monkeypatch):
    monkeypatch.setattr(forked_host, "release_openmp_threads", lambda: False)
    assert "OpenMP" in why_not_fork([Device("cpu", 0, (0, 1))])
    assert "OpenMP" in why_not_fork([Device("cpu", 0, (0,)), Device("cpu", 1, (1,))], one_process=True)
    assert why_not_fork([Device("cpu", 0, (0,)), Device("cpu", 1, (1,))]) is None  # one thread each: no region


def test_a_loaded_cuda_driver_is_not_forked(monkeypatch):
    """On an H200, a script that had called torch.cuda.is_available() (the driver loaded and initialised, torch's
    CUDA state not) got a forked host whose worker died in its first CUDA call, with no error, trial after trial."""
    from optuna_saturn.pools import forked_host

    monkeypatch.setattr(forked_host, "cuda_driver_loaded", lambda: True)
    assert "loaded the CUDA driver" in why_not_fork([Device("cuda", 0)])
    assert why_not_fork([Device("cpu", 0, (0,))]) is None  # CPU workers never touch CUDA
    monkeypatch.undo()
    assert forked_host.cuda_driver_loaded() is False  # (this machine has no GPU: the driver is never loaded)


def test_a_pool_closed_while_its_host_warms_up_stops_at_once(saturn_options):
    """A sweep with nothing to run closes its pool while the host still warms the objective up: the host ends at
    the pool's SIGTERM. (It is a fork of the executor, whose handler makes SIGTERM a KeyboardInterrupt, and the
    warm-up ignores what the objective raises: the pool waited 10 s for it, then killed it.)"""
    import time

    started = time.monotonic()
    SaturnExecutor(devices=1, strategies=["single"], **saturn_options).optimize(
        optuna.create_study(), objectives.slow_to_warm_up, n_trials=0
    )
    assert time.monotonic() - started < 8


@pytest.mark.launch
@pytest.mark.parametrize("queued", [False, True])
def test_a_described_trial_starts_once_its_worker_is_up_while_the_next_is_still_described(saturn_options, queued):
    """Describing a trial blocks the sweep's thread (seconds, for a large model's first imports): a trial described
    before it starts as soon as a worker comes up meanwhile, not once the description ends; one of the study's
    queue too, which is planned then (the queue's trials are otherwise all described before the first plan)."""
    study = optuna.create_study()
    for lr in (0.02, 0.03) if queued else ():
        study.enqueue_trial({"lr": lr})
    executor = SaturnExecutor(devices=2, strategies=["single", "ddp"], **saturn_options)
    executor.optimize(study, objectives.described_slowly_after_the_first, n_trials=2)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    first, second = (t.system_attrs for t in study.trials)
    described = second["saturn:asked_at"] + second["saturn:describe_seconds"]
    assert second["saturn:describe_seconds"] >= 3.0
    assert first["saturn:actual_start"] < described - 1.0, (first["saturn:actual_start"], described)


@pytest.mark.launch
def test_ctrl_c_while_a_trial_is_described_leaves_no_trial_running(saturn_options, monkeypatch):
    """The asked trial was no trial of the sweep's yet (not waiting, not running), so the sweep's stop did not end
    it: it stayed RUNNING until another sweep's recovery round. It ends FAIL with the reason, as waiting ones do."""
    from optuna_saturn.pools.processes import ProcessPool

    def interrupted(self) -> None:  # (what the pool checks while a description runs: Ctrl-C lands there)
        raise KeyboardInterrupt

    monkeypatch.setattr(ProcessPool, "_still_up", interrupted)
    study = optuna.create_study()
    executor = SaturnExecutor(devices=2, strategies=["single", "ddp"], **saturn_options)
    with pytest.raises(KeyboardInterrupt):
        executor.optimize(study, objectives.described_slowly_after_the_first, n_trials=2)
    assert study.trials and all(t.state == TrialState.FAIL for t in study.trials), [t.state for t in study.trials]
    reasons = [t.system_attrs["saturn:fail_reason"] for t in study.trials]  # (trial 0's, or trial 1's, on timing)
    assert [r for r in reasons if "while it was described" in r], reasons
