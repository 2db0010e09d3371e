"""Command lines and environments for the launchers, in one place (modelled on Accelerate's launch utilities).

On CPU the launchers' own FSDP/DeepSpeed switches would silently fall back to DDP (notes/cpu-facts.md), so the
launcher only ever starts N worker processes; the strategy itself is applied by the worker's engine.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from optuna_saturn.devices import Device, cuda_device_count, physical_gpus
from optuna_saturn.strategy import Strategy

WORKER_MODULE = "optuna_saturn.worker.launched"
_LOOPBACK_ONLY = 'ip link set lo up && exec "$@"'


@dataclass(frozen=True)
class Launch:
    command: list[str]
    env: dict[str, str]


def network_isolation_prefix() -> list[str]:
    """Run a command in a fresh network namespace that has only loopback (DESIGN decision 9).

    torchrun, the deepspeed launcher and ``accelerate launch --multi_gpu`` listen on every interface whatever
    ``master_addr`` says; inside this namespace there is no interface but ``lo``. Each trial gets its own
    namespace, so concurrent trials cannot collide on rendezvous ports either.
    """
    missing = [tool for tool in ("unshare", "ip") if shutil.which(tool) is None]
    if missing:
        raise RuntimeError(f"isolate_network=True needs {missing} (util-linux and iproute2) on PATH.")
    user_namespace = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user_namespace, "--net", "--", "sh", "-c", _LOOPBACK_ONLY, "sh"]


_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000


def enter_loopback_only_namespace() -> None:
    """Move this (single-threaded) process into a fresh network namespace that has only loopback, as
    :func:`network_isolation_prefix` does for a command: the same ``unshare``, from inside (a forked pool host)."""
    import ctypes
    import subprocess

    if shutil.which("ip") is None:
        raise RuntimeError("isolate_network=True needs 'ip' (iproute2) on PATH.")
    uid, gid = os.geteuid(), os.getegid()
    flags = _CLONE_NEWNET if uid == 0 else _CLONE_NEWUSER | _CLONE_NEWNET
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"unshare(network namespace) failed: {os.strerror(error)}")
    if uid != 0:  # root inside the new user namespace, as `unshare --map-root-user`
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w", encoding="ascii") as f:
                f.write(text)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)


def free_port() -> int:
    """A free TCP port on loopback, for launchers that need one named (in an isolated namespace any port is)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]  # (an AF_INET socket's name is (host, port))
        return port


def _torchrun(devices: Sequence[Device]) -> tuple[list[str], Mapping[str, str | None]]:
    # --standalone: a private c10d rendezvous on a free port, so concurrent trials never share one.
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={len(devices)}",
        "--max-restarts=0",
        "--monitor-interval=0.1",
        "-m",
        WORKER_MODULE,
    ]
    return command, _visible_devices(devices)


def _deepspeed(devices: Sequence[Device]) -> tuple[list[str], Mapping[str, str | None]]:
    # The deepspeed launcher rewrites CUDA_VISIBLE_DEVICES itself from --include, which names physical GPUs: it
    # must see every GPU (no mask), and get the physical indices behind this process's own mask.
    command = [
        sys.executable,
        "-m",
        "deepspeed.launcher.runner",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        "--no_local_rank",
        "--module",
    ]
    env: dict[str, str | None] = {}  # (None: a variable the worker must not inherit)
    if devices[0].kind == "cuda":
        physical = physical_gpus(devices)
        if not all(p.isdigit() for p in physical):
            raise RuntimeError(
                f"The deepspeed launcher names GPUs by index, but CUDA_VISIBLE_DEVICES names them otherwise "
                f"({os.environ.get('CUDA_VISIBLE_DEVICES')!r}). Use a strategy whose launcher is 'torchrun' (the "
                "shipped DeepSpeed strategies are), or set CUDA_VISIBLE_DEVICES to indices."
            )
        command[3:3] = [f"--include=localhost:{','.join(physical)}"]
        env["CUDA_VISIBLE_DEVICES"] = None  # (removed from the inherited environment by build_launch)
    else:
        command[3:3] = [f"--num_gpus={len(devices)}"]
        env.update(_visible_devices(devices))
    return [*command, WORKER_MODULE], env


def _accelerate(devices: Sequence[Device]) -> tuple[list[str], Mapping[str, str | None]]:
    # On CPU, only ACCELERATE_USE_CPU=1 with --multi_gpu starts N synchronised processes (notes/cpu-facts.md).
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--num_machines=1",
        f"--num_processes={len(devices)}",
        f"--main_process_port={free_port()}",
        "--mixed_precision=no",
        "--dynamo_backend=no",
    ]
    env = _visible_devices(devices)
    if len(devices) > 1:
        command.append("--multi_gpu")
    if devices[0].kind == "cpu":
        env["ACCELERATE_USE_CPU"] = "1"
    return [*command, "-m", WORKER_MODULE], env


def _visible_devices(devices: Sequence[Device]) -> dict[str, str]:
    if devices[0].kind == "cuda":
        return {"CUDA_VISIBLE_DEVICES": ",".join(physical_gpus(devices))}
    return {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": str(max(1, len(devices[0].cores)))}


def worker_environment(kind: str, log_dir: Path) -> dict[str, str]:
    """What every worker process of a pool of ``kind`` devices runs with (its GPU mask comes per worker, from
    :func:`optuna_saturn.worker.gpu.own_gpu`): CUDA availability asked of NVML (it initialises no driver, so a
    process that asks can still fork workers), DeepSpeed's accelerator named (not probed), and on GPUs NCCL's
    errors raised in the rank that waits (not left to hang) with its trace on a timeout in the pool's log
    folder, and the allocator's expandable segments (less fragmentation between runs of different sizes)."""
    env = {
        "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
        "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", kind),
        "TORCH_EXTENSIONS_DIR": extensions_folder(kind),
    }
    if kind != "cuda":
        return {**env, "CUDA_VISIBLE_DEVICES": ""}
    return {
        **env,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # (the order optuna_saturn.nvml maps a mask's index entries in)
        "NCCL_SOCKET_IFNAME": "lo",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(log_dir / "nccl-trace-rank"),
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
    }


def host_environment(kind: str, log_dir: Path) -> dict[str, str]:
    """What a pool host (:mod:`optuna_saturn.pools.warm_host`) runs with, and its workers after it: gloo over
    loopback (a trial's ranks are on one machine), DeepSpeed's ops cache, and :func:`worker_environment`."""
    return {
        "PYTHONUNBUFFERED": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(extensions_cache())),
        **worker_environment(kind, log_dir),
    }


def extensions_cache(kind: str | None = None) -> Path:
    """DeepSpeed compiles its ops on first use (about 90 s); keep them across trials and sweeps, in a folder of
    their own for each :func:`build_key`. One folder for every environment made two environments on a machine
    rebuild each other's op inside their trials (the build files name the environment's paths, so PyTorch's
    builder finds them changed), and a trial stopped during such a build left its lock for the next to hang on.
    ``kind``: the devices' kind (default: this machine's, ``cuda`` where a GPU is visible)."""
    return Path.home() / ".cache" / "optuna-saturn" / "torch_extensions" / build_key(kind or _machine_kind())


def extensions_folder(kind: str) -> str:
    """Where the workers of ``kind`` devices build and load DeepSpeed's ops: the user's ``TORCH_EXTENSIONS_DIR``,
    else :func:`extensions_cache`."""
    return os.environ.get("TORCH_EXTENSIONS_DIR") or str(extensions_cache(kind))


@functools.cache
def build_key(kind: str) -> str:
    """What an op build depends on: Python's ABI, torch's version (with its CUDA version), DeepSpeed's version,
    the devices' kind (CPU and GPU builds of an op share its name), and a digest of where Python, torch and
    DeepSpeed are installed (their paths are in the build files: another environment of the same versions would
    rebuild the op too)."""
    import importlib.metadata
    import importlib.util

    import torch

    try:
        deepspeed = importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        deepspeed = "none"
    cuda = f"-cuda{torch.version.cuda}" if kind == "cuda" and torch.version.cuda else ""
    ds_spec = importlib.util.find_spec("deepspeed")
    places = [sys.prefix, os.path.dirname(torch.__file__), str(ds_spec.origin if ds_spec is not None else "")]
    digest = hashlib.sha256("\n".join(places).encode()).hexdigest()[:8]
    return f"{sys.implementation.cache_tag}-torch{torch.__version__}-deepspeed{deepspeed}-{kind}{cuda}-{digest}"


def _machine_kind() -> str:
    return "cuda" if cuda_device_count() > 0 else "cpu"


_LAUNCHERS = {"torchrun": _torchrun, "deepspeed": _deepspeed, "accelerate": _accelerate}


def build_launch(
    strategy: Strategy, devices: Sequence[Device], spec_path: str, *, isolate_network: bool = False
) -> Launch:
    """The command and environment that start ``len(devices)`` workers of one trial."""
    command, extra_env = _LAUNCHERS[strategy.launcher](devices)
    inherited = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # (as worker_environment's)
        "TORCH_EXTENSIONS_DIR": extensions_folder(devices[0].kind),
        **extra_env,
    }
    env = {k: v for k, v in inherited.items() if v is not None}
    command = [*command, spec_path]
    if isolate_network:
        command = network_isolation_prefix() + command
        env["GLOO_SOCKET_IFNAME"] = "lo"  # the host name may resolve to an address this namespace lacks
    return Launch(command=command, env=env)
