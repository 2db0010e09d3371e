"""The GPU check's parts in one go, each in a fresh process under its own time limit, on one GPU or two.

    python benchmarks/gpu/review_checks.py [--parts C0,C1,...] [--budget 320] [--dry]

Each part prints ``CHECK <id>: PASS|FAIL|INFO|SKIP <numbers>`` lines; a summary of them ends the run, and the exit
code is non-zero if any part failed. DeepSpeed's ops are built first, outside every part (``build_ops.py``; nothing
to do once built). A part gets the least of its own limit and what is left of ``--budget``; on one
GPU the limits of the parts that run add up to ``ONE_GPU_SECONDS``, within check.sh's share for this script, so
that no part is cut for time. The two-GPU parts (C8, M1-M4) say SKIP at once, with the reason, on fewer than two
GPUs (counted by nvidia-smi: this process never initialises CUDA).

``--dry`` runs on a machine without a GPU: every part does what it can on CPU devices (two over gloo for the
two-GPU parts), with small sizes, and what needs a GPU says SKIP. tests/test_gpu_check_script.py runs it so.

- C0-C8: the GPU review's checks (issue 36), ``checks_review.py``.
- C9, C10: bf16 on the GPU; a model that fits only sharded under a memory cap (issue 46),
  ``checks_precision_sharding.py``.
- M1-M4: placement on GPU 1, rank 1 out of memory under NCCL, NCCL bandwidth between one-GPU workers, a rank
  killed mid-collective (issue 46), ``checks_two_gpus.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checks_common import WORK, gpu_count


class Part:
    """One part: where its function is, its time limit on a GPU and in the dry run, and the GPUs it needs."""

    def __init__(self, module: str, seconds: int, dry_seconds: int, gpus: int = 1) -> None:
        self.module, self.seconds, self.dry_seconds, self.gpus = module, seconds, dry_seconds, gpus

    def run(self, name: str) -> bool:
        return getattr(importlib.import_module(self.module), name.lower())()


PARTS: dict[str, Part] = {
    "C0": Part("checks_review", 15, 20),
    "C1": Part("checks_review", 40, 60),
    "C2": Part("checks_review", 45, 60),
    "C3": Part("checks_review", 15, 30),
    "C4": Part("checks_review", 30, 40),
    "C5": Part("checks_review", 35, 50),
    "C6": Part("checks_review", 30, 20),
    "C7": Part("checks_review", 15, 30),
    "C8": Part("checks_review", 45, 60, gpus=2),
    "C9": Part("checks_precision_sharding", 25, 60),
    "C10": Part("checks_precision_sharding", 35, 60),
    "M1": Part("checks_two_gpus", 30, 40, gpus=2),
    "M2": Part("checks_two_gpus", 40, 40, gpus=2),
    "M3": Part("checks_two_gpus", 30, 40, gpus=2),
    "M4": Part("checks_two_gpus", 45, 60, gpus=2),
}
#: The parts a machine of one GPU runs, and their limits together: check.sh gives this script at least as much.
ONE_GPU_SECONDS = sum(part.seconds for part in PARTS.values() if part.gpus == 1)


def run_part(name: str, limit: float) -> tuple[str, int]:
    """One part in a fresh process of its own session, under ``limit`` seconds: its output and exit code. Whatever
    it leaves running (a pool host, workers: a timed-out part's above all) is killed with it, so that the next
    part finds its GPU free."""
    process = subprocess.Popen(
        [sys.executable, __file__, "--part", name],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=limit)
        code = process.returncode
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        output, _ = process.communicate()
        output, code = (output or "") + f"\nCHECK {name}: FAIL (timed out after {limit:.0f} s)", 1
    _kill_group(process.pid)
    return output, code


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def skipped(name: str, part: Part, dry: bool, gpus: int) -> str | None:
    """Why a part does not run here, or None."""
    if part.gpus > 1 and not dry and gpus < part.gpus:
        return f"needs {part.gpus} GPUs, {gpus} seen"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--budget", type=float, default=320.0, help="seconds for every part together")
    parser.add_argument("--dry", action="store_true", help="no GPU: what each part can do on CPU devices")
    parser.add_argument("--part", help=argparse.SUPPRESS)  # (one part, in this fresh process)
    args = parser.parse_args()
    if args.dry:  # (a rehearsal of the script on CPU devices: it waits for no other sweep's devices)
        os.environ["REVIEW_DRY"] = "1"
        os.environ.setdefault("OPTUNA_SATURN_LEASES", "off")
    if args.part:
        WORK.mkdir(parents=True, exist_ok=True)
        sys.exit(0 if PARTS[args.part].run(args.part) else 1)
    unknown = [name for name in args.parts.split(",") if name not in PARTS]
    if unknown:
        parser.error(f"unknown parts {unknown}: choose among {', '.join(PARTS)}")
    shutil.rmtree(WORK, ignore_errors=True)
    gpus = 0 if args.dry else gpu_count()
    started, lines, failed, took = time.monotonic(), [], [], []
    # (DeepSpeed's ops before any part: a build inside a part would take its time; a no-op once built)
    subprocess.run([sys.executable, str(Path(__file__).resolve().parent / "build_ops.py")], timeout=args.budget)
    took.append(f"ops {time.monotonic() - started:.0f}s")
    for name in args.parts.split(","):
        part = PARTS[name]
        why = skipped(name, part, args.dry, gpus)
        if why:
            lines.append(f"CHECK {name}: SKIP ({why})")
            continue
        left = args.budget - (time.monotonic() - started)
        limit = min(part.dry_seconds if args.dry else part.seconds, left)
        if limit < 10:
            lines.append(f"CHECK {name}: SKIP (the budget is spent)")
            continue
        print(f"===== {name} (limit {limit:.0f} s)", flush=True)
        begun = time.monotonic()
        output, code = run_part(name, limit)
        took.append(f"{name} {time.monotonic() - begun:.0f}s")
        print(output[-6000:], flush=True)
        lines += [line for line in output.splitlines() if line.startswith("CHECK ")]
        if code != 0:
            failed.append(name)
    print(f"===== SUMMARY ({time.monotonic() - started:.0f} s: {', '.join(took)})")
    print("\n".join(lines))
    print(f"FAILED: {', '.join(failed)}" if failed else "every part passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
