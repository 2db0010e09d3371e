"""What the GPU paths promise, tested on CPU where only a GPU could show the fault itself (issue 36; DESIGN 14).

Each test checks a contract: the environment each rank sees, no fork of a host that touched CUDA, a traceback and
a failure for a worker that dies starting or joining, the kind of an error from any rank, the order in which a run
lets go of its memory. ``benchmarks/gpu/review_checks.py`` checks the faults themselves on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import gpu_objectives
import optuna
import pytest
import torch
from optuna.trial import TrialState

from optuna_saturn import SaturnExecutor
from optuna_saturn.channel import ChannelServer
from optuna_saturn.clock import WallClock
from optuna_saturn.profiler import ProfileStore
from optuna_saturn.strategy import load_strategies
from optuna_saturn.study.trial_session import TrialSession
from optuna_saturn.worker import gpu
from optuna_saturn.worker.failures import CRASH, MISMATCH, OUT_OF_MEMORY, error_kind, first_failure
from optuna_saturn.worker.objective_recipe import describe_objective
from optuna_saturn.worker.warm import JobRunner

TESTS = Path(__file__).parent


# -- every rank on its own device --------------------------------------------------------------------------------
@pytest.mark.launch
def test_every_rank_sees_one_device_and_the_variables_a_launcher_sets(saturn_options):
    """LOCAL_RANK is the ordinal of the one device a rank sees (0), whatever its rank in the job; DeepSpeed's
    accelerator is named and CUDA availability is asked of NVML (no driver initialised by a probe)."""
    study = optuna.create_study()
    SaturnExecutor(devices=2, strategies=["ddp"], profile=False, **saturn_options).optimize(
        study, gpu_objectives.ranks_environment, n_trials=1
    )
    trial = study.trials[0]
    assert trial.state == TrialState.COMPLETE, trial.system_attrs.get("saturn:fail_reason")
    ranks = trial.user_attrs["ranks"]
    assert [r["RANK"] for r in ranks] == ["0", "1"] and {r["WORLD_SIZE"] for r in ranks} == {"2"}
    assert {(r["LOCAL_RANK"], r["LOCAL_WORLD_SIZE"], r["trial_local_rank"]) for r in ranks} == {("0", "1", 0)}
    assert [r["GROUP_RANK"] for r in ranks] == ["0", "1"]
    assert {(r["CUDA_VISIBLE_DEVICES"], r["DS_ACCELERATOR"], r["PYTORCH_NVML_BASED_CUDA_CHECK"]) for r in ranks} == {
        ("", "cpu", "1")
    }


def test_a_gpu_worker_is_bound_to_its_gpu_before_cuda_starts(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    gpu.own_gpu("GPU-5a1b")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-5a1b"
    assert gpu.rank_environment(3, 4)["LOCAL_RANK"] == "0" and gpu.rank_environment(3, 4)["RANK"] == "3"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="before it was bound to its GPU"):
        gpu.own_gpu("2")  # too late: the driver read the mask already


def test_a_ray_actor_runs_on_the_gpu_ray_gave_it(monkeypatch):
    """With RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES an actor sees every GPU of its node: its accelerator ids
    say which is its own."""
    from optuna_saturn.pools.ray_actor import actor_gpu

    class Context:
        def __init__(self, ids: list) -> None:
            self.ids = ids

        def get_accelerator_ids(self) -> dict:
            return {"GPU": self.ids}

    import ray

    monkeypatch.setattr(ray, "get_runtime_context", lambda: Context(["3"]))
    assert actor_gpu() == "3"
    monkeypatch.setattr(ray, "get_runtime_context", lambda: Context(["0", "1"]))
    with pytest.raises(RuntimeError, match="exactly one GPU"):
        actor_gpu()


def test_mig_instances_are_one_device_each_for_one_device_strategies(monkeypatch):
    from optuna_saturn.devices import largest_trial, resolve_devices
    from optuna_saturn.strategy import select_strategies

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-aaaa,MIG-bbbb,MIG-cccc")
    devices = resolve_devices("auto")
    assert [(d.kind, d.mig) for d in devices] == [("cuda", True)] * 3
    assert largest_trial(devices) == 1
    chosen = select_strategies(["single", "ddp", "fsdp"], largest_trial(devices), device_kind="cuda")
    assert [s.name for s in chosen] == ["single"]
    from optuna_saturn.devices import physical_gpus

    assert physical_gpus(devices) == ["MIG-aaaa", "MIG-bbbb", "MIG-cccc"]  # one per worker's mask


# -- fork safety -------------------------------------------------------------------------------------------------
@pytest.mark.launch
def test_a_host_that_initialised_cuda_starts_its_workers_fresh_and_says_why(saturn_options):
    """The host imported a module that initialised CUDA (faked: this build has none): its forks could not use
    the GPU, so each worker is a fresh interpreter, and the host's log says why."""
    import cuda_in_host

    study = optuna.create_study()
    SaturnExecutor(devices=2, strategies=["ddp"], profile=False, **saturn_options).optimize(
        study, cuda_in_host.objective, n_trials=1
    )
    trial = study.trials[0]
    assert trial.state == TrialState.COMPLETE, trial.system_attrs.get("saturn:fail_reason")
    assert "--worker" in trial.user_attrs["cmdline"]  # rank 0's process: started, not forked
    host_log = next(saturn_options["log_dir"].rglob("pool-host.log")).read_text()
    assert "starts its workers as fresh interpreters: this process has initialised CUDA" in host_log


def test_describing_and_warming_up_hide_the_gpus(monkeypatch):
    """TrainingArguments takes its CPU branch (no set_device on cuda:0) and is_available() asks NVML."""
    from optuna_saturn.profiler._without_gpus import without_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    with without_gpus():
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "" and os.environ["ACCELERATE_USE_CPU"] == "true"
        assert os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"
        from transformers import TrainingArguments

        assert TrainingArguments(output_dir="/tmp/unused", report_to=[]).device.type == "cpu"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1" and "ACCELERATE_USE_CPU" not in os.environ


# -- no silent deaths --------------------------------------------------------------------------------------------
@pytest.fixture
def environment_kept():
    """A job run in this process sets a launcher's variables (RANK, WORLD_SIZE, ...); a worker whose job fails is
    replaced, this test process is not: what it set must not reach the next tests' pools."""
    import torch.distributed as dist

    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
    if dist.is_initialized():  # (a job that failed or was cut before its end: a fork of this process inherits it)
        dist.destroy_process_group()


def _in_process_job(tmp_path: Path, objective, strategy: str) -> tuple[dict, TrialSession, ChannelServer]:
    """A one-rank trial job spec for a JobRunner in this process, its session and the channel serving it."""
    study = optuna.create_study()
    session = TrialSession(study.ask(), threading.Lock(), WallClock())
    server = ChannelServer()
    job = {
        "channel": server.address,
        "token": server.register(session.handle),
        "objective": describe_objective(objective, server.folder),
        "trial_number": 0,
        "strategy": load_strategies()[strategy].to_json(),
        "profile": None,
        "gradient_accumulation": 1,
        "errors": str(tmp_path / "job"),
        "checkpoint": None,
        "name": "job",
        "rank": 0,
        "world_size": 1,
        "log": str(tmp_path / "job.log"),
        "rendezvous": f"file://{tmp_path / 'rendezvous'}",
        "timeout": 30,
    }
    return job, session, server


def test_a_worker_that_cannot_join_leaves_its_traceback_and_its_failure(tmp_path, capfd, environment_kept):
    """A GPU worker whose process group cannot start (here: no CUDA in this build; on a GPU, NCCL's "unhandled
    system error" from a small /dev/shm, or an invalid device ordinal): the job log has the traceback, the rank
    its failure file, and the worker is replaced."""
    job, _, server = _in_process_job(tmp_path, gpu_objectives.ranks_environment, "single")
    with server, capfd.disabled():  # (the job's log takes this process's stdout and stderr, as in a worker)
        clean, replace = JobRunner(
            {"kind": "cuda", "index": 0, "cores": [], "node": ""}, objectives={}, memory_limit=None
        ).run(job, worker=0)
    assert (clean, replace) == (False, True)
    log = Path(job["log"]).read_text()
    assert "Traceback" in log and "could not run job" in log
    failure = first_failure(job["errors"])
    assert failure is not None and failure.rank == 0 and failure.kind == CRASH and failure.error


def test_a_worker_that_cannot_start_says_why_in_its_log_and_its_exit_code(tmp_path):
    """The pool host's worker dies before its first job (its channel is gone): a traceback and the exit code of a
    worker that could not start (its host gives up on it after three), not a silent exit 0."""
    config = {
        "devices": [{"kind": "cpu", "index": 0, "cores": [], "node": ""}],
        "channel": str(tmp_path / "no-such-socket"),
        "token": "x",
        "host_pid": os.getpid(),
    }
    code = "import json, sys; from optuna_saturn.worker.warm import serve; serve(json.loads(sys.argv[1]), 0, None)"
    done = subprocess.run([sys.executable, "-c", code, json.dumps(config)], capture_output=True, text=True, timeout=120)
    from optuna_saturn.pools.worker_starts import COULD_NOT_START

    assert done.returncode == COULD_NOT_START
    assert "Traceback" in done.stdout + done.stderr and "stopped on the error above" in done.stdout + done.stderr


# -- out of memory on any rank -------------------------------------------------------------------------------------
def test_an_out_of_memory_is_told_by_its_type_and_by_its_message():
    from optuna_saturn.engines import StrategyMismatch

    assert (
        error_kind(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), world_size=2)
        == OUT_OF_MEMORY
    )
    assert error_kind(MemoryError(), world_size=2) == OUT_OF_MEMORY
    for message in (
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
        "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error, NCCL version 2.21.5\n"
        "Last error:\nFailed to CUDA calloc 10485760 bytes",
        "CUDA error: out of memory",
    ):
        assert error_kind(RuntimeError(message), world_size=2) == OUT_OF_MEMORY, message
    wrapped = RuntimeError("the step failed")
    wrapped.__cause__ = torch.OutOfMemoryError("CUDA out of memory")
    assert error_kind(wrapped, world_size=2) == OUT_OF_MEMORY
    assert error_kind(StrategyMismatch("no"), world_size=2) == MISMATCH
    assert error_kind(ValueError("loss is nan"), world_size=2) == CRASH


def test_a_rank_that_lost_its_peer_did_not_fail_first():
    """A killed rank leaves no failure file; its peers' "connection reset by peer" are its effect. They are told
    apart from the trial's own errors, and a real failure is the job's first, whatever its time."""
    from optuna_saturn.worker.failures import PEER_GONE

    for message in (
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:28349: Connection reset by peer",
        "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Connection closed by peer [127.0.0.1]:5321",
        "NCCL error: remote process exited or there was a network error",
    ):
        assert error_kind(RuntimeError(message), world_size=2) == PEER_GONE, message
    wrapped = RuntimeError("validation failed")
    wrapped.__context__ = RuntimeError("Connection reset by peer")
    assert error_kind(wrapped, world_size=2) == PEER_GONE
    assert error_kind(BrokenPipeError(32, "Broken pipe"), world_size=2) == CRASH  # (a DataLoader worker that died)
    assert error_kind(RuntimeError("Connection reset by peer"), world_size=1) == CRASH  # (one rank has no peer)
    out_of_memory_after = RuntimeError("CUDA out of memory")
    out_of_memory_after.__context__ = RuntimeError("Connection reset by peer")
    assert error_kind(out_of_memory_after, world_size=2) == OUT_OF_MEMORY


@pytest.mark.launch
def test_out_of_memory_on_rank_1_tries_more_micro_batches_and_is_never_run_again_as_it_was(saturn_options):
    """Rank 1 runs out of memory (rank 0 waits in the step's collective and is stopped): the profile records
    DDP x2 as out of memory in its steps and measures it with 2 micro-batches; and a trial that runs out of
    memory on rank 1 is not run again on the same option."""
    executor = SaturnExecutor(devices=2, strategies=["ddp"], **saturn_options)
    study = executor.profile(gpu_objectives.out_of_memory_on_rank_1, n_trials=1)
    records = {r.gradient_accumulation: r for r in ProfileStore(saturn_options["profile_store"]).records()}
    assert records[1].feasible is False and records[1].more_micro_batches_may_fit, records[1]
    assert "rank 1" in records[1].error and "out of memory" in records[1].error
    assert records[2].feasible is True
    assert study.trials[0].system_attrs["saturn:options"][0]["gradient_accumulation"] == 2

    unprofiled = optuna.create_study()
    SaturnExecutor(devices=2, strategies=["ddp"], profile=False, **saturn_options).optimize(
        unprofiled, gpu_objectives.out_of_memory_on_rank_1, n_trials=1
    )
    assert len(unprofiled.trials) == 1  # not run again as a new trial
    trial = unprofiled.trials[0]
    assert trial.state == TrialState.FAIL and trial.system_attrs["saturn:fail_reason"].startswith(
        "rank 1: RuntimeError"
    )


# -- memory between runs -------------------------------------------------------------------------------------------
def test_a_runs_engine_is_gone_before_its_process_group(tmp_path, monkeypatch, capfd, environment_kept):
    """A ZeRO engine still referenced when the job's process group is destroyed and the cache emptied keeps its
    partitions, optimizer state and buckets allocated through the next run (a false out-of-memory there), and is
    finalised after its communicators are gone. The run lets go first: by the time the process group is
    destroyed, the engine has been collected."""
    import torch.distributed as dist

    seen_at_destroy: list[bool] = []
    destroy = dist.destroy_process_group

    def watched(*args, **kwargs) -> None:
        seen_at_destroy.append(any(ref() is not None for ref in gpu_objectives.PREPARED))
        destroy(*args, **kwargs)

    monkeypatch.setattr(dist, "destroy_process_group", watched)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    # As a pool does before a ZeRO job: DeepSpeed's CPU op, in the workers' folder, built and without a stale lock
    # (with torch's default folder, a lock another process left there made this job wait until it timed out).
    from optuna_saturn.pools import deepspeed_ops
    from optuna_saturn.pools.launch_commands import extensions_cache

    folder = extensions_cache("cpu")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(folder))
    deepspeed_ops.build_missing("cpu", {"TORCH_EXTENSIONS_DIR": str(folder)}, log=tmp_path / "ops.log")
    job, session, server = _in_process_job(tmp_path, gpu_objectives.keeps_a_weak_reference, "zero2")
    with server, capfd.disabled():
        clean, replace = JobRunner({"kind": "cpu", "index": 0, "cores": [], "node": ""}, objectives={}).run(
            job, worker=0
        )
    assert session.outcome is not None and session.outcome["op"] == "result", Path(job["log"]).read_text()[-3000:]
    assert (clean, replace) == (True, False)
    assert len(gpu_objectives.PREPARED) == 1 and type(gpu_objectives.PREPARED[0]).__name__ == "ReferenceType"
    assert seen_at_destroy == [False]


def test_a_replacement_waits_for_its_gpus_memory_to_come_back():
    used = iter([30e9, 20e9, 2.1e9])
    clock = iter(range(100))
    back, waited = gpu.wait_for_memory_back(
        lambda: next(used), 2e9, sleep=lambda s: None, clock=lambda: float(next(clock))
    )
    assert back and waited > 0
    stuck = gpu.wait_for_memory_back(
        lambda: 30e9, 2e9, timeout=5, sleep=lambda s: None, clock=iter(range(100)).__next__
    )
    assert stuck[0] is False and stuck[1] >= 5
    assert gpu.wait_for_memory_back(lambda: None, 2e9)[0] is False  # NVML cannot tell: do not wait


def test_each_job_starts_from_the_same_random_state_and_without_compiled_code(monkeypatch):
    """The CUDA generators are captured and put back like the CPU's (faked: no CUDA here), and torch.compile's
    caches are reset, so a trial's dropout masks and compiled frames do not depend on the worker's history."""
    from optuna_saturn.process_state import ProcessState

    states = {"cuda": [torch.tensor([1], dtype=torch.uint8)]}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: list(states["cuda"]))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda new: states.__setitem__("cuda", list(new)))
    baseline = ProcessState.capture()
    states["cuda"] = [torch.tensor([9], dtype=torch.uint8)]  # a trial drew from the GPU's generator
    compiled = torch.compile(lambda x: x * 2, backend="eager")
    compiled(torch.ones(2))
    from torch._dynamo import convert_frame

    assert convert_frame.input_codes.seen
    baseline.restore()
    assert states["cuda"][0].item() == 1
    assert not convert_frame.input_codes.seen


# -- FSDP on nested ModuleLists ------------------------------------------------------------------------------------
def test_nested_repeated_blocks_come_children_first():
    from optuna_saturn.engines._blocks import outermost_blocks, repeated_blocks

    model = gpu_objectives.NestedBlocks()
    order = repeated_blocks(model)
    position = {id(m): i for i, m in enumerate(order)}
    for block in model.block:  # each block after everything it holds
        assert all(
            position[id(m)] < position[id(block)] for m in block.modules() if id(m) in position and m is not block
        )
    assert len(order) == 2 * (2 + 2) + 2  # per block: 2 layers and 2 experts; and the 2 blocks
    assert outermost_blocks(model) == list(model.block)


@pytest.mark.launch
def test_fsdp_shards_a_model_of_nested_module_lists_and_trains_like_single(saturn_options):
    """T5's ``block[i].layer`` and a mixture of experts' ``experts``: FSDP2 shards the inner blocks first (a parent
    first would already manage them), and the trial trains as under single."""
    study = optuna.create_study()
    for _ in range(2):
        study.enqueue_trial({})
    runs = {}
    for number, (strategy, devices) in enumerate((("single", 1), ("fsdp", 2))):
        executor = SaturnExecutor(devices=devices, strategies=[strategy], profile=False, **saturn_options)
        executor.optimize(study, gpu_objectives.nested_curve, n_trials=1)
        runs[strategy] = study.trials[number]
    for trial in runs.values():
        assert trial.state == TrialState.COMPLETE, trial.system_attrs.get("saturn:fail_reason")
    assert runs["fsdp"].user_attrs["facts"]["sharded_params"] is True
    assert runs["fsdp"].user_attrs["losses"] == pytest.approx(runs["single"].user_attrs["losses"], rel=1e-5)


# -- models that fit only when sharded -------------------------------------------------------------------------------
def test_the_memory_estimate_counts_the_optimizers_state_as_each_strategy_shards_it():
    from optuna_saturn.profiler import model_state_bytes
    from optuna_saturn.profiler._memory import optimizer_states

    s = load_strategies()
    adamw = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
    states = optimizer_states(adamw)
    assert states == 2 and optimizer_states(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)) == 0
    n = 1_000_000  # 4 MB of float32 parameters, 4 of gradients, 8 of AdamW's moments
    assert model_state_bytes(n, 4, s["single"], 1, optimizer_states=states) == 16e6
    assert model_state_bytes(n, 4, s["fsdp"], 2, optimizer_states=states) == 8e6
    assert model_state_bytes(n, 4, s["zero3"], 2, optimizer_states=states) == 8e6
    assert model_state_bytes(n, 4, s["zero1"], 2, optimizer_states=states) == 12e6  # only the moments sharded
    assert model_state_bytes(n, 4, s["zero2"], 2, optimizer_states=states) == 10e6  # and the gradients
    assert model_state_bytes(n, 4, s["zero3-offload"], 1, optimizer_states=states) == 0


def test_the_planner_leaves_out_what_cannot_fit_a_device_of_the_given_memory(tmp_path):
    """devices=2, device_memory=...: options whose model state cannot fit (by the estimate) are never offered,
    and a profile whose peak exceeded the device's memory makes its option infeasible there; near capacity it is
    flagged. The stored profile itself stays as measured (a larger device fits it)."""
    import dataclasses

    from optuna_saturn.pricing.measured import within
    from optuna_saturn.profiler import ProfileRecord

    record = ProfileRecord(
        key="k", strategy="single", devices=1, hardware="cpu", feasible=True, step_seconds=0.1, peak_memory_bytes=3e9
    )
    over = within(record, 2e9)
    assert over.feasible is False and over.more_micro_batches_may_fit and "exceeds the device's" in over.error
    assert within(record, 3.1e9).near_capacity and within(record, 8e9) == record and record.feasible
    assert within(dataclasses.replace(record, feasible=False), 1.0).feasible is False
    with pytest.raises(ValueError, match="2GiB"):
        SaturnExecutor(devices=1, strategies=["single"], device_memory="lots")
    assert SaturnExecutor(devices=1, strategies=["single"], device_memory="1.5GiB")._options.device_memory == int(
        1.5 * 2**30
    )


@pytest.mark.launch
def test_a_model_that_fits_only_when_sharded_runs_under_fsdp_and_zero3_and_never_whole(saturn_options):
    """CPU devices of 1780 MiB each, and a model that needs more than that on one device (100 M parameters with
    AdamW) and fits when halved: once profiled, single is over the devices' memory and never planned; the trial
    runs COMPLETE under fsdp x2 and under zero3 x2, and no rank's peak comes near the whole model's (what single
    held). (The planner's estimate, 1.5 GiB of model state for single, is a lower bound: the profile's peak
    decides here.)"""
    from optuna_saturn.profiler import ProfileStore

    capacity = 1780 * 2**20
    # (single alone is profiled: the sharded options' profiles decide nothing here, and each cost a run as long as
    # the trial's; the trial's first run under an option nobody measured is that option's profile)
    SaturnExecutor(
        devices=2, strategies=["single"], device_memory=capacity, profile_steps=(1, 2), **saturn_options
    ).profile(gpu_objectives.fits_only_sharded, params=[{"lr": 3e-4}])
    ran = {}
    for strategy in ("fsdp", "zero3"):
        executor = SaturnExecutor(devices=2, strategies=["single", strategy], device_memory=capacity, **saturn_options)
        study = optuna.create_study()
        study.enqueue_trial({"lr": 3e-4})
        executor.optimize(study, gpu_objectives.fits_only_sharded, n_trials=1)
        ran[strategy] = trial = study.trials[0]
        assert trial.state == TrialState.COMPLETE, trial.system_attrs.get("saturn:fail_reason")
        assert (trial.system_attrs["saturn:strategy"], trial.system_attrs["saturn:num_devices"]) == (strategy, 2)
        assert [o["strategy"] for o in trial.system_attrs["saturn:options"]] == [strategy]  # single is never planned
    single = next(r for r in ProfileStore(saturn_options["profile_store"]).records() if r.strategy == "single")
    assert single.peak_memory_bytes > capacity  # measured once, then never planned on these devices
    for strategy, trial in ran.items():
        peaks = trial.user_attrs["rank_peaks"]
        assert len(peaks) == 2 and max(peaks) < 0.9 * single.peak_memory_bytes, (strategy, peaks, single)
        assert trial.user_attrs["losses"] == pytest.approx(ran["fsdp"].user_attrs["losses"], rel=1e-4)


# -- DeepSpeed's ops, built before any timed or watched run ------------------------------------------------------
def test_the_ops_a_zero_job_would_build_in_a_trial_are_looked_for_in_the_workers_extensions_folder(tmp_path):
    from optuna_saturn.pools.deepspeed_ops import missing

    assert missing("cpu", tmp_path) == ["ShareMemCommBuilder"]
    (tmp_path / "deepspeed_shm_comm").mkdir()
    (tmp_path / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").write_bytes(b"")
    assert missing("cpu", tmp_path) == [] and missing("cuda", tmp_path) == []


def test_a_build_lock_a_killed_build_left_is_removed_and_a_fresh_one_is_kept(tmp_path, monkeypatch, caplog):
    """A ZeRO sweep stopped with kill -9 while DeepSpeed built its op left the build's lock: every later build
    waited on it for ever (a whole CI run hung on one). A lock older than any build is removed before the build."""
    import time

    from optuna_saturn.pools import deepspeed_ops

    folder = tmp_path / "extensions"
    (folder / "deepspeed_shm_comm").mkdir(parents=True)
    lock, ninja = folder / "deepspeed_shm_comm" / "lock", folder / "deepspeed_shm_comm" / ".ninja_lock"
    for path in (lock, ninja):
        path.write_text("")
    long_ago = time.time() - deepspeed_ops.STALE_LOCK_SECONDS - 60
    os.utime(lock, (long_ago, long_ago))
    assert deepspeed_ops.remove_stale_locks("cpu", folder) == [lock]  # (the fresh one: a build may hold it)
    assert not lock.exists() and ninja.exists()
    os.utime(ninja, (long_ago, long_ago))
    lock.write_text("")
    os.utime(lock, (long_ago, long_ago))
    seen = tmp_path / "seen"  # (the build stand-in says whether the old lock was still there)
    build = f"test -e {lock} && echo held > {seen} || echo free > {seen}"
    monkeypatch.setattr(deepspeed_ops, "build_command", lambda builders: ["sh", "-c", build])
    with caplog.at_level("WARNING", logger="optuna.saturn.runner"):
        deepspeed_ops.build_missing("cpu", {"TORCH_EXTENSIONS_DIR": str(folder)}, log=tmp_path / "ops.log")
    assert seen.read_text().strip() == "free" and not ninja.exists()  # removed before the build started
    assert f"Removed {lock}" in caplog.text


def test_a_build_past_its_limit_is_stopped_with_what_it_started_and_its_lock_removed(tmp_path, monkeypatch, caplog):
    """A build that does not end (it waits on a lock another build holds, say) is stopped at its limit with the
    compilers it started (its process group), and the lock it took is removed: a killed build's lock would hold
    every later one."""
    import time

    import psutil

    from optuna_saturn.pools import deepspeed_ops

    folder = tmp_path / "extensions"
    (folder / "deepspeed_shm_comm").mkdir(parents=True)
    lock, pids = folder / "deepspeed_shm_comm" / "lock", tmp_path / "pids"
    hang = f"touch {lock}; sleep 600 & echo $! > {pids}; wait"  # (a child of its own, as ninja's compilers)
    monkeypatch.setattr(deepspeed_ops, "build_command", lambda builders: ["sh", "-c", hang])
    monkeypatch.setattr(deepspeed_ops, "BUILD_TIMEOUT_SECONDS", 2.0)
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="optuna.saturn.runner"):
        deepspeed_ops.build_missing("cpu", {"TORCH_EXTENSIONS_DIR": str(folder)}, log=tmp_path / "ops.log")
    assert time.monotonic() - started < 30
    assert not lock.exists() and "did not end in" in caplog.text
    child = int(pids.read_text())
    deadline = time.monotonic() + 10.0  # (a SIGKILL is delivered when the process next runs: on a busy machine, later)
    while time.monotonic() < deadline:
        try:
            if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the build's child {child} still runs 10 s after the build was stopped")


@pytest.mark.launch
def test_a_zero_sweep_builds_what_is_missing_before_its_pool_starts(saturn_options, tmp_path, monkeypatch, caplog):
    """An op missing from the workers' extensions folder is built by the pool before its workers start, in a
    process of its own, and said so (here an op DeepSpeed does not know, which it skips: the real one takes 1-2
    min the first time, once per machine)."""
    from optuna_saturn.pools import deepspeed_ops

    monkeypatch.setitem(deepspeed_ops.OPS, "cpu", {"NoSuchBuilder": "no_such_op"})
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    study = optuna.create_study()
    with caplog.at_level("WARNING", logger="optuna.saturn.runner"):
        SaturnExecutor(devices=2, strategies=["zero2"], profile=False, **saturn_options).optimize(
            study, gpu_objectives.ranks_environment, n_trials=1
        )
    assert study.trials[0].state == TrialState.COMPLETE, study.trials[0].system_attrs.get("saturn:fail_reason")
    # (whether its ranks imported DeepSpeed is not this test's: an objective that prepares nothing, as this one,
    # imports no strategy in the host, so that depended on what earlier tests had imported in this process)
    assert "Building DeepSpeed's no_such_op for this machine before the sweep starts" in caplog.text
    log = next(saturn_options["log_dir"].rglob("deepspeed-ops.log")).read_text()
    assert "NoSuchBuilder does not apply here" in log


# -- the smaller findings ------------------------------------------------------------------------------------------
def test_a_collective_may_wait_its_own_timeout_not_the_rendezvous_one(tmp_path, environment_kept):
    import torch.distributed as dist

    from optuna_saturn.worker.rank import join_process_group, leave_process_group

    place = join_process_group(
        {"kind": "cpu", "index": 0, "cores": [], "node": ""},
        0,
        1,
        init_method=f"file://{tmp_path / 'rendezvous'}",
        rendezvous_timeout=5,
        collective_timeout=1234,
    )
    try:
        assert dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout.total_seconds() == 1234
    finally:
        leave_process_group(place)


def test_a_gpu_worker_runs_its_share_of_the_cores_it_may_use(monkeypatch):
    """A GPU worker's CPU work (an offloaded optimizer step, a collate function) gets its share of the machine's
    threads, no more than the cores it is pinned to near its GPU; a CPU device's worker, its device's cores."""
    from optuna_saturn.worker.warm import size_threads

    before = torch.get_num_threads()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    try:
        size_threads({"kind": "cuda", "index": 0, "cores": [], "node": ""}, gpu_threads=8)
        assert torch.get_num_threads() == 3
        size_threads({"kind": "cuda", "index": 0, "cores": [], "node": ""}, gpu_threads=2)
        assert torch.get_num_threads() == 2
        size_threads({"kind": "cpu", "index": 0, "cores": [0], "node": ""})
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_exclusive_gpus_are_named_where_a_launcher_would_start_a_trials_processes(monkeypatch):
    from optuna_saturn import nvml
    from optuna_saturn.devices import Device
    from optuna_saturn.pools.launched import exclusive_mode_conflict
    from optuna_saturn.strategy import Strategy

    monkeypatch.setattr(nvml, "exclusive_gpus", lambda: [1])
    gpus = [Device("cuda", 0), Device("cuda", 1)]
    launched = Strategy.from_json(
        {**load_strategies()["ddp"].to_json(), "name": "ddp-launched", "launcher": "accelerate"}
    )
    assert exclusive_mode_conflict(gpus, [load_strategies()["ddp"]]) is None  # warm workers alone: fine
    assert "nvidia-smi -c DEFAULT" in exclusive_mode_conflict(gpus, [launched])


@pytest.mark.launch
def test_unsettled_timed_steps_are_timed_again_and_their_spread_kept(saturn_options):
    """The first timed steps of a profile vary (a cache warms, buckets are rebuilt): timed once more, the settled
    set kept, its spread stored with the profile."""
    from optuna_saturn.profiler import ProfileStore

    SaturnExecutor(devices=1, strategies=["single", "single-ckpt"], **saturn_options).profile(
        gpu_objectives.slow_first_steps, n_trials=1
    )
    (record,) = [r for r in ProfileStore(saturn_options["profile_store"]).records() if r.strategy == "single"]
    assert record.timed_steps == 5 and record.step_spread is not None and record.step_spread < 1.2
    assert record.step_seconds < 0.03  # the settled steps, not the slow first ones


@pytest.mark.launch
def test_every_rank_times_its_steps_again_when_one_ranks_spread_is_unsettled(saturn_options):
    """Rank 1's first timed steps are slow, rank 0's are not: both time their steps again, so the DDP profile
    completes (a rank deciding alone left the other in a different collective: a CI run's ddpx2 profiles failed
    with gloo's "collective mismatch")."""
    from optuna_saturn.profiler import ProfileStore

    SaturnExecutor(devices=2, strategies=["ddp"], **saturn_options).profile(
        gpu_objectives.slow_first_steps_on_rank_1, n_trials=1
    )
    (record,) = ProfileStore(saturn_options["profile_store"]).records()
    assert record.feasible and record.timed_steps == 5
