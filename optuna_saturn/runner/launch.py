"""Command lines and environments for the launchers, in one place (modelled on Accelerate's launch utilities).

On CPU the launchers' own FSDP/DeepSpeed switches would silently fall back to DDP (notes/cpu-facts.md), so the
launcher only ever starts N worker processes; the strategy itself is applied by the worker's engine.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from optuna_saturn.devices import Device
from optuna_saturn.strategy import Strategy

WORKER_MODULE = "optuna_saturn._worker"
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


def _torchrun(nprocs: int) -> list[str]:
    # --standalone: a private c10d rendezvous on a free port, so concurrent trials never share one.
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
        f"--nproc-per-node={nprocs}", "--max-restarts=0", "--monitor-interval=0.1", "-m", WORKER_MODULE,
    ]


def build_launch(
    strategy: Strategy, devices: Sequence[Device], spec_path: str, *, isolate_network: bool = False
) -> Launch:
    """The command and environment that start ``len(devices)`` workers of one trial."""
    if strategy.launcher != "torchrun":
        raise NotImplementedError(f"launcher {strategy.launcher!r} (strategy {strategy.name!r}) is not wired yet.")
    command = _torchrun(len(devices)) + [spec_path]
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if devices[0].kind == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d.index) for d in devices)
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["OMP_NUM_THREADS"] = str(max(1, len(devices[0].cores)))
    if isolate_network:
        command = network_isolation_prefix() + command
    return Launch(command=command, env=env)
