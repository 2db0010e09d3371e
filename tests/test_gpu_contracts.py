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
    assert trial.state == TrialState.COMPLETE, trial.user_attrs.get("saturn:fail_reason")
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
    from optuna_saturn.pools.launch_commands import physical_gpus

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
    assert trial.state == TrialState.COMPLETE, trial.user_attrs.get("saturn:fail_reason")
    assert "--worker" in trial.user_attrs["cmdline"]  # rank 0's process: started, not forked
    host_log = next(saturn_options["log_dir"].rglob("pool-host.log")).read_text()
    assert "starts its workers as fresh interpreters: this process has initialised CUDA" in host_log


def test_describing_and_warming_up_hide_the_gpus(monkeypatch):
    """TrainingArguments takes its CPU branch (no set_device on cuda:0) and is_available() asks NVML."""
    from optuna_saturn.profiler._probe import without_gpus

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
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


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
    """The pool host's worker dies before its first job (its channel is gone): a traceback and exit code 1, not a
    silent exit 0."""
    config = {
        "devices": [{"kind": "cpu", "index": 0, "cores": [], "node": ""}],
        "channel": str(tmp_path / "no-such-socket"),
        "token": "x",
        "host_pid": os.getpid(),
    }
    code = "import json, sys; from optuna_saturn.worker.warm import serve; serve(json.loads(sys.argv[1]), 0, None)"
    done = subprocess.run([sys.executable, "-c", code, json.dumps(config)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "Traceback" in done.stdout + done.stderr and "stopped on the error above" in done.stdout + done.stderr


# -- out of memory on any rank -------------------------------------------------------------------------------------
def test_an_out_of_memory_is_told_by_its_type_and_by_its_message():
    from optuna_saturn.engines import StrategyMismatch

    assert error_kind(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")) == OUT_OF_MEMORY
    assert error_kind(MemoryError()) == OUT_OF_MEMORY
    for message in (
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
        "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error, NCCL version 2.21.5\n"
        "Last error:\nFailed to CUDA calloc 10485760 bytes",
        "CUDA error: out of memory",
    ):
        assert error_kind(RuntimeError(message)) == OUT_OF_MEMORY, message
    wrapped = RuntimeError("the step failed")
    wrapped.__cause__ = torch.OutOfMemoryError("CUDA out of memory")
    assert error_kind(wrapped) == OUT_OF_MEMORY
    assert error_kind(StrategyMismatch("no")) == MISMATCH
    assert error_kind(ValueError("loss is nan")) == CRASH


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
    assert study.trials[0].user_attrs["saturn:options"][0]["gradient_accumulation"] == 2

    unprofiled = optuna.create_study()
    SaturnExecutor(devices=2, strategies=["ddp"], profile=False, **saturn_options).optimize(
        unprofiled, gpu_objectives.out_of_memory_on_rank_1, n_trials=1
    )
    assert len(unprofiled.trials) == 1  # not run again as a new trial
    trial = unprofiled.trials[0]
    assert trial.state == TrialState.FAIL and trial.user_attrs["saturn:fail_reason"].startswith("rank 1: RuntimeError")


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
    from optuna_saturn.worker.process_state import ProcessState

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
