"""What every part of the GPU check shares: its verdict lines, whether it runs on a GPU, its executor, what
``nvidia-smi`` says, whether DeepSpeed imports, and the placement each trial recorded from inside itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parent.parent / "examples"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
#: The review's own folder (emptied as a run starts), inside check.sh's (which keeps set-up's files beside it).
WORK = Path(os.environ.get("GPU_CHECK_WORK", tempfile.gettempdir() + "/gpu-check")) / "review"
DRY = os.environ.get("REVIEW_DRY") == "1"
#: Where setup.sh (or the first part that asks) writes whether ``import deepspeed`` works in this environment.
DEEPSPEED_IMPORT = "deepspeed-import.json"


def check(part: str, verdict: str, text: str = "") -> bool:
    print(f"CHECK {part}: {verdict}{' ' + text if text else ''}", flush=True)
    return verdict != "FAIL"


def cuda() -> bool:
    """A GPU part (not ``--dry``). Asked of NVML, so that the check's own process never initialises CUDA: the
    executor's pool host may then be a fork, as in a user's process."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import torch

    return not DRY and torch.cuda.is_available()


def part_work(part: str) -> Path:
    """This part's own folder: its runs, profiles and rendezvous files, apart from the other parts'."""
    folder = WORK / part
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def executor(part: str, **options):
    from optuna_saturn import SaturnExecutor

    work = part_work(part)
    defaults = {
        "devices": [0] if cuda() else 1,
        "log_dir": work / "runs",
        "profile_store": work / "profiles",
        "progress": "quiet",
        "dashboard": False,
        "grace_period": 2,
    }
    return SaturnExecutor(**{**defaults, **options})


def smi(query: str) -> list[str]:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        return [line.strip() for line in out.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError):
        return []


def used_mib() -> float | None:
    values = smi("memory.used")
    return float(values[0]) if values else None


def gpu_count() -> int:
    """GPUs on this machine, from nvidia-smi (no CUDA initialised here)."""
    return len(smi("index"))


def deepspeed_import() -> dict[str, str]:
    """Whether DeepSpeed is installed and imports here: ``{"state": "ok" | "absent" | "broken", "reason": ...}``.
    Installed but broken (a pydantic-core that does not match pydantic, say) is a FAIL of every DeepSpeed part,
    never a SKIP. Asked once per run, in a fresh interpreter (as a worker imports it: the accelerator named, CUDA
    asked of NVML), and kept in the run's folder."""
    import importlib.util

    saved = WORK / DEEPSPEED_IMPORT
    if saved.exists():
        return json.loads(saved.read_text())
    if importlib.util.find_spec("deepspeed") is None:
        result = {"state": "absent", "reason": "DeepSpeed is not installed"}
    else:
        env = {**os.environ, "DS_ACCELERATOR": "cuda" if cuda() else "cpu", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
        done = subprocess.run(
            [sys.executable, "-c", "import deepspeed"], env=env, capture_output=True, text=True, timeout=120
        )
        lines = done.stderr.strip().splitlines()
        result = (
            {"state": "ok", "reason": ""}
            if done.returncode == 0
            else {
                "state": "broken",
                "reason": "import deepspeed: " + (lines[-1] if lines else f"exit {done.returncode}"),
            }
        )
    WORK.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(result))
    return result


def without_deepspeed(part: str, what: str) -> bool | None:
    """The verdict of a DeepSpeed part that cannot run (SKIP when not installed, FAIL with the reason when its
    import breaks), or None when it can."""
    found = deepspeed_import()
    if found["state"] == "ok":
        return None
    return check(part, "SKIP" if found["state"] == "absent" else "FAIL", f"{what}: {found['reason']}")


def expected_entry(index: int) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` entry a worker on pool device ``index`` must see: the entry of this process's
    own mask (what ``devices=[index]`` names), or ``""`` on a CPU device (a CPU worker hides the GPUs)."""
    if not cuda():
        return ""
    from optuna_saturn.devices import physical_gpus

    return physical_gpus([SimpleNamespace(index=index)])[0]  # type: ignore[list-item]


def placement_problems(entries: list[dict], expected_visible: str) -> list[str]:
    """What is wrong with where the trials ran, as each recorded it from inside itself (``review_objectives``'
    ``entry`` attribute): its ``CUDA_VISIBLE_DEVICES`` must be its pool entry, ``LOCAL_RANK`` "0", and its current
    CUDA device 0 (-1 on a CPU device)."""
    device = 0 if expected_visible else -1
    problems = []
    for i, entry in enumerate(entries):
        seen = (entry.get("visible"), entry.get("local_rank_env"), entry.get("current_device"))
        if seen != (expected_visible, "0", device):
            problems.append(
                f"trial {i}: (mask, LOCAL_RANK, current device) {seen} != {(expected_visible, '0', device)}"
            )
    return problems
