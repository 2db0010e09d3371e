"""DeepSpeed's compiled ops that a sweep's ZeRO jobs would otherwise build inside a trial, built once before the
pool starts.

DeepSpeed compiles some ops the first time a process needs them: on CPU devices its shared-memory communication
op (``deepspeed_shm_comm``), when a ZeRO job's process group starts. On a fresh machine that took 2 min 5 s here,
with the machine busy, inside the first ZeRO trial: stall detection stopped it 4 s after the build ended, and the
trial went into the study as FAIL. A compile is not a stall, and it belongs before any timed or watched run: the
pool builds what is missing first, in a process of its own, into the extensions folder its workers use (where it
stays for later sweeps), and says so while it builds. A build that fails is reported; the op is then built (or
done without) where DeepSpeed would have built it.

Which ops, by device kind and by the sweep's ZeRO strategies (read from DeepSpeed 0.19.8: a ZeRO job hands
``deepspeed.initialize`` the user's optimizer, and DeepSpeed then builds no optimizer op of its own):

- CPU devices: the shared-memory op, for every ZeRO strategy.
- GPUs: ``DeepSpeedCPUAdam``'s ``cpu_adam`` where a strategy offloads the optimizer (its step then runs it, in
  place of the user's Adam or AdamW: :mod:`optuna_saturn.engines._offload_optimizer`); ``FusedAdam``'s
  ``fused_adam`` where a strategy names Adam or AdamW in its own DeepSpeed config without offloading it (DeepSpeed
  makes that optimizer for a trial that prepares none). Nothing else, so a sweep without such a strategy compiles
  nothing (``nvcc`` takes minutes).

The build runs :func:`main` in a fresh interpreter (:func:`build_missing`). PyTorch's builder takes a lock file
in the op's folder while it builds and waits, for ever, while another holds it: a build that was killed (a sweep
stopped with ``kill -9`` in its first minutes) leaves its lock, and every later ZeRO job on the machine used to
hang on it in silence. Every process that loads the op takes that lock, built or not: a stale lock
(:mod:`optuna_saturn.pools.build_locks`) is removed before every pool starts, with a warning, whether the op is
built or missing, and the build has a limit.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna

from optuna_saturn.engines._offload_optimizer import offloads_optimizer
from optuna_saturn.pools.build_locks import LOCK_NAMES, building, stale
from optuna_saturn.pools.build_locks import STALE_LOCK_SECONDS as STALE_LOCK_SECONDS  # (its old home)
from optuna_saturn.pools.launch_commands import extensions_folder
from optuna_saturn.strategy.engine_registry import traits_of

_logger = optuna.logging.get_logger("optuna.saturn.runner")

#: The ops a ZeRO job may build on its own, by device kind: DeepSpeed's builder class and the op's name (its folder
#: and library in the extensions folder). Those in :data:`NEEDED_WHEN` only where a strategy needs them.
OPS: dict[str, dict[str, str]] = {
    "cpu": {"ShareMemCommBuilder": "deepspeed_shm_comm"},
    "cuda": {"CPUAdamBuilder": "cpu_adam", "FusedAdamBuilder": "fused_adam"},
}


def _offloads_optimizer(config: Mapping[str, Any]) -> bool:
    return offloads_optimizer(config.get("zero_optimization", {}))


def _names_a_fused_adam(config: Mapping[str, Any]) -> bool:
    optimizer = config.get("optimizer") or {}
    adam = str(optimizer.get("type", "")).lower() in ("adam", "adamw")
    return adam and not (optimizer.get("params") or {}).get("torch_adam") and not _offloads_optimizer(config)


#: The ops built only for some strategies: whether one strategy (its DeepSpeed config) needs it.
NEEDED_WHEN: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    "CPUAdamBuilder": _offloads_optimizer,
    "FusedAdamBuilder": _names_a_fused_adam,
}


#: Past this, the build is stopped and the sweep goes on (its ZeRO jobs build the op, or run without it).
BUILD_TIMEOUT_SECONDS = 20 * 60


def remove_stale_locks(kind: str, folder: Path) -> list[Path]:
    """Remove the build locks of ``kind``'s ops in the extensions ``folder`` that no build can still hold
    (:func:`~optuna_saturn.pools.build_locks.stale`); returns them."""
    removed = []
    for path in (folder / op / name for op in OPS.get(kind, {}).values() for name in LOCK_NAMES):
        if stale(path):
            path.unlink(missing_ok=True)
            removed.append(path)
    for path in removed:
        _logger.warning(f"Removed {path}: a DeepSpeed op build that was killed left it, and builds wait on it.")
    return removed


def _remove_locks(kind: str, folder: Path, *, before: float = math.inf, since: float = -math.inf) -> list[Path]:
    """Remove the build locks of ``kind``'s ops last written between ``since`` and ``before`` (epoch seconds)."""
    removed = []
    for op in OPS.get(kind, {}).values():
        for name in LOCK_NAMES:
            path = folder / op / name
            try:
                written = path.stat().st_mtime
            except FileNotFoundError:
                continue
            if since <= written < before:
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def needed_by(engines: Iterable[str]) -> bool:
    """Whether any of a sweep's engines compiles ops the first time a process needs them (its traits say so:
    ``builds_ops``; DeepSpeed's are the ones this module builds)."""
    return any(traits_of(name).builds_ops for name in engines)


def seconds_since_a_build() -> float:
    """0 while a live process holds an op's build lock in the extensions folders this machine's workers use (a
    trial whose ranks build an op, or wait for another's build, is not stalled), else the seconds since the last
    build ended (its library written: the trial's silence counts from there), or inf."""
    folders = [Path(extensions_folder(kind)) for kind in OPS]
    names = [op for ops in OPS.values() for op in ops.values()]
    if building(folders, names):
        return 0.0
    ended = -math.inf
    for library in (folder / op / f"{op}.so" for folder in folders for op in names):
        try:
            ended = max(ended, library.stat().st_mtime)
        except FileNotFoundError:
            continue
    return time.time() - ended


def build_command(builders: Sequence[str]) -> list[str]:
    """The build, in a fresh interpreter."""
    return [sys.executable, "-c", f"import sys; from {__name__} import main; main(sys.argv[1:])", *builders]


def missing(kind: str, folder: Path, configs: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """The builders of the ops ZeRO jobs on ``kind`` devices need, under the strategies whose DeepSpeed ``configs``
    are given, whose library is not in the extensions ``folder`` yet."""
    return [
        builder
        for builder, op in OPS.get(kind, {}).items()
        if (builder not in NEEDED_WHEN or any(NEEDED_WHEN[builder](c) for c in configs))
        and not (folder / op / f"{op}.so").exists()
    ]


def build_missing(kind: str, env: Mapping[str, str], *, log: Path, configs: Sequence[Mapping[str, Any]] = ()) -> None:
    """Build the ops ZeRO jobs on ``kind`` devices would build in a trial, if any is missing (``env``: the
    workers', whose ``TORCH_EXTENSIONS_DIR`` receives them; ``configs``: the sweep's ZeRO strategies' DeepSpeed
    configs)."""
    folder = Path(env["TORCH_EXTENSIONS_DIR"])
    remove_stale_locks(kind, folder)  # (a built op's too: every process that loads it takes its lock first)
    builders = missing(kind, folder, configs)
    if not builders:
        return
    names = ", ".join(OPS[kind][b] for b in builders)
    _logger.warning(
        f"Building DeepSpeed's {names} for this machine before the sweep starts: once (1-2 min), then kept in "
        f"{env['TORCH_EXTENSIONS_DIR']} (log: {log})."
    )
    started, began = time.monotonic(), time.time() - 1.0  # (a file's time may round down)
    with open(log, "ab") as out:  # (in a process group of its own: the compilers it starts end with it)
        build = subprocess.Popen(
            build_command(builders),
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            code = build.wait(timeout=BUILD_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(build.pid, signal.SIGKILL)
            build.wait()
            _remove_locks(kind, folder, since=began)  # (its own: they would hold every later build)
            _logger.warning(
                f"Building DeepSpeed's {names} did not end in {BUILD_TIMEOUT_SECONDS / 60:.0f} min (log: {log}; "
                f"another build holding a lock in {folder}?): the sweep goes on, and ZeRO jobs build it themselves."
            )
            return
    if code != 0:
        _logger.warning(
            f"Building DeepSpeed's {names} failed (exit code {code}; log: {log}): ZeRO jobs build it "
            "themselves, or run without it."
        )
        return
    _logger.warning(f"Built DeepSpeed's {names} in {time.monotonic() - started:.0f} s.")


def main(builders: Sequence[str]) -> None:
    from deepspeed.accelerator import get_accelerator

    for name in builders:
        builder = get_accelerator().create_op_builder(name)
        # (an accelerator names the ops it lacks NotImplementedBuilder: it says it is compatible, then fails)
        if builder is None or type(builder).__name__ == "NotImplementedBuilder" or not builder.is_compatible():
            print(f"optuna-saturn: DeepSpeed's {name} does not apply here; nothing to build.", flush=True)
            continue
        builder.load(verbose=True)
        print(f"optuna-saturn: built {builder.absolute_name()}.", flush=True)
