"""Build the DeepSpeed ops the check's ZeRO parts need (``cpu_adam`` for zero3-offload on a GPU; the shared-memory
op on CPU devices), before any part runs, with the pool's own builder into the pool's own extensions folder.

A pool builds them before its first ZeRO job too, but inside the part that starts it, under that part's time limit:
a build of a minute or more would time that part out, and the next ZeRO parts would wait on its lock. Built here,
once (setup.sh on the device machine; review_checks.py before its parts), each part finds them.

    python benchmarks/gpu/build_ops.py     # prints what it built, how long it took, and what is still missing
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checks_common import DRY, WORK, cuda, deepspeed_import

#: The ZeRO strategies the check runs (C2, C4, C9, C10): the ops they need are built.
STRATEGIES = ("zero2", "zero3-offload")


def main() -> int:
    found = deepspeed_import()
    if found["state"] != "ok":
        print(f"DeepSpeed ops: nothing built ({found['state']}: {found['reason']})")
        return 0
    from optuna_saturn.pools.deepspeed_ops import build_missing, missing
    from optuna_saturn.pools.launch_commands import extensions_cache
    from optuna_saturn.strategy import load_strategies

    kind = "cuda" if cuda() else "cpu"
    strategies = load_strategies()
    configs = [dict(strategies[name].launcher_config) for name in STRATEGIES]
    folder = Path(os.environ.get("TORCH_EXTENSIONS_DIR", str(extensions_cache())))
    wanted = missing(kind, folder, configs)
    started = time.monotonic()
    if wanted:
        env = {"TORCH_EXTENSIONS_DIR": str(folder), "DS_ACCELERATOR": kind, "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
        build_missing(kind, env, log=WORK.parent / "deepspeed-ops.log", configs=configs)
    print(
        f"DeepSpeed ops for {kind}{' (dry run)' if DRY else ''} in {folder}: built "
        f"{wanted or 'nothing (none missing)'} in {time.monotonic() - started:.0f} s; still missing: "
        f"{missing(kind, folder, configs) or 'none'}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
