"""A shared 8-GPU node as NVML shows it, faked on CPU: which GPU a mask's entry is, which partitioned GPUs refuse a
sweep, how much memory the planner plans on, and where an out-of-memory beside another process is recorded.

The fake stands in for ``pynvml`` itself (not for :mod:`optuna_saturn.nvml`), so the calls the package makes are
the ones tested: a GPU has NVML's index (its place in the list), a PCI bus id, a UUID, MIG mode, memory, and the
processes that hold some of it.
"""

from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import pytest

from optuna_saturn import leases, nvml
from optuna_saturn.devices import Device, resolve_devices
from optuna_saturn.planner import Option
from optuna_saturn.pools.launch_commands import build_launch, worker_environment
from optuna_saturn.pricing.pricer import Pricer
from optuna_saturn.profiler import ProfileStore, Workload
from optuna_saturn.profiler._hardware import device_memory_bytes, hardware_fingerprint
from optuna_saturn.strategy import load_strategies, select_strategies

GiB = 2**30
OTHER_PID = 4_000_000  # (no such process here: someone else's)


@dataclass
class FakeGPU:
    bus: int
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total: int = 80 * GiB
    mig: bool = False
    processes: dict[int, int | None] = field(default_factory=dict)  # pid -> bytes it holds (None: NVML won't say)
    cores: tuple[int, ...] = ()
    lists_processes: bool = True

    @property
    def used(self) -> int:
        return sum(held or 0 for held in self.processes.values())


def fake_pynvml(gpus: list[FakeGPU]) -> types.ModuleType:
    """``pynvml`` on a node whose GPUs NVML lists in the order of ``gpus`` (its index), whatever their bus ids."""
    module = types.ModuleType("pynvml")

    def by_uuid(uuid: str) -> FakeGPU:
        found = [g for g in gpus if g.uuid == uuid]
        if not found:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return found[0]

    def processes(gpu: FakeGPU) -> list[types.SimpleNamespace]:
        if not gpu.lists_processes:
            raise RuntimeError("NVML_ERROR_NO_PERMISSION")
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=held) for pid, held in gpu.processes.items()]

    module.__dict__.update(
        NVML_DEVICE_MIG_ENABLE=1,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda i: gpus[i],
        nvmlDeviceGetHandleByUUID=by_uuid,
        nvmlDeviceGetPciInfo=lambda g: types.SimpleNamespace(domain=0, bus=g.bus, device=0),
        nvmlDeviceGetName=lambda g: g.name,
        nvmlDeviceGetUUID=lambda g: g.uuid,
        nvmlDeviceGetMemoryInfo=lambda g: types.SimpleNamespace(total=g.total, used=g.used, free=g.total - g.used),
        nvmlDeviceGetMigMode=lambda g: (int(g.mig), int(g.mig)),
        nvmlDeviceGetComputeRunningProcesses=processes,
        nvmlDeviceGetGraphicsRunningProcesses=lambda g: [],
        nvmlDeviceGetCpuAffinity=lambda g, words: [sum(1 << c for c in g.cores)] + [0] * (words - 1),
    )
    return module


@pytest.fixture
def node(monkeypatch):
    """Install a fake node: ``node(gpus)`` puts its ``pynvml`` in place and returns the GPUs."""

    def install(gpus: list[FakeGPU]) -> list[FakeGPU]:
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(gpus))
        return gpus

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return install


# -- NVML's index is not CUDA's -----------------------------------------------------------------------------------
def test_an_index_entry_is_the_gpu_cuda_numbers_so_in_pci_bus_order_not_nvmls_index(node, monkeypatch):
    """NVML lists the H100 on bus 0x81 first, the A100 on bus 0x01 second. Workers number GPUs by PCI bus id, so
    cuda:0 is the A100: its memory, its NUMA cores, its hardware key and its lease are the A100's."""
    node(
        [
            FakeGPU(bus=0x81, uuid="GPU-h100", cores=(8, 9)),
            FakeGPU(bus=0x01, uuid="GPU-a100", name="NVIDIA A100-SXM4-40GB", total=40 * GiB, cores=(0, 1)),
        ]
    )
    assert worker_environment("cuda", Path("/tmp"))["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert nvml.uuid_of("0") == "GPU-a100"
    assert nvml.local_cores("0") == [0, 1]
    assert nvml.gpu_model("1") == ("NVIDIA H100 80GB HBM3", 80 * GiB)
    assert hardware_fingerprint(Device("cuda", 0)) == "cuda:NVIDIA A100-SXM4-40GB:40GiB"
    assert leases.lease_names(Device("cuda", 0)) == ["cuda-GPU-a100.lease"]
    # Under SLURM's cgroups the mask counts the allowed GPUs from 0, and NVML lists only those: the same order.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert leases.lease_names(Device("cuda", 0)) == ["cuda-GPU-h100.lease"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a100")
    assert nvml.local_cores(os.environ["CUDA_VISIBLE_DEVICES"]) == [0, 1]


def test_a_launched_trials_processes_number_the_gpus_as_the_workers_do(node, tmp_path):
    launch = build_launch(load_strategies()["ddp"], [Device("cuda", 0), Device("cuda", 1)], str(tmp_path / "spec"))
    assert launch.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


# -- MIG ------------------------------------------------------------------------------------------------------------
def test_a_gpu_in_mig_mode_outside_the_mask_does_not_refuse_the_sweep(node, monkeypatch):
    """GPU 7 is partitioned for notebooks: a sweep on GPUs 0 and 1 goes on; one that would use GPU 7 is refused,
    naming it as the mask does."""
    node([FakeGPU(bus=i, uuid=f"GPU-{i}", mig=i == 7) for i in range(8)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert [str(d) for d in resolve_devices("auto", n_cuda=2)] == ["cuda:0", "cuda:1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,7")
    with pytest.raises(ValueError, match=r"GPU\(s\) \['7'\].*MIG mode.*CUDA_VISIBLE_DEVICES=MIG-"):
        resolve_devices("auto", n_cuda=2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert len(resolve_devices(7, n_cuda=8)) == 7  # (the first seven: GPU 7 is not among them)
    assert [d.index for d in resolve_devices([0, 3], n_cuda=8)] == [0, 3]
    with pytest.raises(ValueError, match=r"\['7'\]"):
        resolve_devices([0, 7], n_cuda=8)
    with pytest.raises(ValueError, match=r"\['7'\]"):
        resolve_devices("auto", n_cuda=8)


# -- free memory ------------------------------------------------------------------------------------------------
def test_the_planner_plans_on_the_memory_other_processes_leave_and_says_so(node, caplog):
    """A notebook holds 12 GiB of GPU 1; the sweep's own processes (this one here) hold 2 GiB of GPU 0, which stay
    the sweep's to use. Where NVML will not list the processes, all memory in use counts as someone else's."""
    gpus = node(
        [
            FakeGPU(bus=0, uuid="GPU-0", processes={os.getpid(): 2 * GiB}),
            FakeGPU(bus=1, uuid="GPU-1", processes={OTHER_PID: 12 * GiB}),
        ]
    )
    with caplog.at_level("WARNING", logger="optuna.saturn.profiler"):
        assert device_memory_bytes([Device("cuda", 0)]) == 80 * GiB
        assert caplog.text == ""
        assert device_memory_bytes([Device("cuda", 0), Device("cuda", 1)]) == 68 * GiB
    assert f"Other processes hold 12.0 GiB of cuda:1's 80.0 GiB (pid {OTHER_PID})" in caplog.text
    assert "plans on the 68.0 GiB left" in caplog.text
    gpus[0].lists_processes = False
    assert device_memory_bytes([Device("cuda", 0)]) == 78 * GiB
    gpus[0].lists_processes, gpus[0].processes = True, {OTHER_PID: None}  # (listed, its memory not told)
    assert device_memory_bytes([Device("cuda", 0)]) == 80 * GiB  # (used: 0 told)


# -- an out-of-memory beside another process -------------------------------------------------------------------
WORKLOAD = Workload("model", 1000, 4, "batch", total_steps=100, global_batch=8)


def _pricer(store: ProfileStore) -> Pricer:
    strategies = select_strategies(["single"], 1, device_kind="cuda")
    return Pricer(describe=lambda trial: WORKLOAD, strategies=strategies, pool=[Device("cuda", 0)], store=store)


@pytest.mark.parametrize("when", ["at the start", "at the out-of-memory"])
def test_an_out_of_memory_beside_another_process_is_kept_for_this_sweep_only(node, tmp_path, when):
    """Another process held 30 GiB of the pool's GPU at the sweep's start (and is gone when the run fails), or
    holds it only when the run fails: the option is left out for this sweep, with the reason in its record, and
    the profile store stays empty, so a later sweep on a free GPU measures it again."""
    (gpu,) = node([FakeGPU(bus=0, uuid="GPU-0")])
    other = {OTHER_PID: 30 * GiB}
    gpu.processes = other if when == "at the start" else {}
    store = ProfileStore(tmp_path / "profiles")
    pricer, trial = _pricer(store), optuna.trial.FixedTrial({}, number=0)
    assert pricer.price(trial).options  # (single ×1 is planned)
    gpu.processes = {} if when == "at the start" else other
    pricer.mark_out_of_memory(0, Option("single", 1, 1.0), "CUDA out of memory")
    price = pricer.price(trial)
    assert not any(o.option.gradient_accumulation == 1 for o in price.options)
    shown = [p for p in price.profiles if not p.get("feasible", True)]
    assert shown and "kept for this sweep only" in str(shown[0])
    assert store.records() == []
    gpu.processes = {}
    assert _pricer(store).price(trial).options[0].option.gradient_accumulation == 1  # (the next sweep tries it)


def test_an_out_of_memory_on_a_gpu_nobody_else_holds_is_stored_as_the_options(node, tmp_path):
    node([FakeGPU(bus=0, uuid="GPU-0", processes={os.getpid(): 70 * GiB})])  # (the sweep's own)
    store = ProfileStore(tmp_path / "profiles")
    pricer = _pricer(store)
    pricer.price(optuna.trial.FixedTrial({}, number=0))
    pricer.mark_out_of_memory(0, Option("single", 1, 1.0), "CUDA out of memory")
    (record,) = store.records()
    assert not record.feasible and "kept for this sweep" not in record.error


# -- mixed models -------------------------------------------------------------------------------------------------
def test_a_pool_of_mixed_gpu_models_is_warned_of_with_the_fix(node, monkeypatch, caplog):
    """Profiles are keyed by the first GPU's model: a pool that mixes an A100 and an H100 is said to be priced as
    its first GPU, with the fix; a pool of one model is not."""
    node([FakeGPU(bus=0x01, uuid="GPU-a100", name="NVIDIA A100-SXM4-40GB", total=40 * GiB), FakeGPU(0x81, "GPU-h100")])
    with caplog.at_level("WARNING", logger="optuna.saturn"):
        resolve_devices("auto", n_cuda=2)
    assert (
        "different models (cuda:0: NVIDIA A100-SXM4-40GB 40 GiB, cuda:1: NVIDIA H100 80GB HBM3 80 GiB)" in caplog.text
    )
    assert (
        "prices them all as cuda:0" in caplog.text and "name GPUs of one model in CUDA_VISIBLE_DEVICES" in caplog.text
    )
    caplog.clear()
    with caplog.at_level("WARNING", logger="optuna.saturn"):
        resolve_devices([1], n_cuda=2)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-h100")
        resolve_devices("auto", n_cuda=1)
    assert caplog.text == ""
