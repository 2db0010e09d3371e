"""The GPU check (benchmarks/gpu/check.sh and review_checks.py) is ready before a GPU is lent: its dry run on CPU
devices goes through every part, each part that can run on CPU passes, and the parts that need a GPU say so; it
fits twice in a lent GPU's 15 minutes; its wheels are pinned; and what it judges on a GPU (memory held between
jobs, where each trial ran, a DeepSpeed that does not import, the two-GPU parts on one GPU) is judged right."""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
GPU = ROOT / "benchmarks" / "gpu"
SCRIPT = GPU / "review_checks.py"
sys.path.insert(0, str(GPU))

import checks_common  # noqa: E402
import checks_review  # noqa: E402
import review_checks  # noqa: E402
import review_objectives  # noqa: E402

MIB = 2**20


def _dry_run(tmp_path, parts: str, budget: int) -> tuple[subprocess.CompletedProcess, list[tuple[str, str, str]]]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry", "--budget", str(budget), "--parts", parts],
        env={**os.environ, "GPU_CHECK_WORK": str(tmp_path / "work")},
        capture_output=True,
        text=True,
        timeout=budget + 15,
    )
    summary = done.stdout.split("===== SUMMARY", 1)[-1]
    print(summary.splitlines()[0] if summary else done.stdout[-2000:])  # (each part's time, shown with -s)
    return done, re.findall(r"^CHECK ([CM]\d+): (PASS|FAIL|INFO|SKIP)(.*)$", summary, re.MULTILINE)


@pytest.mark.launch
def test_the_dry_run_goes_through_every_part_and_passes_what_a_cpu_can_check(tmp_path):
    parts = [f"C{i}" for i in range(11)]
    done, checks = _dry_run(tmp_path, ",".join(parts), budget=270)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert {part for part, _, _ in checks} == set(parts), checks
    assert not [c for c in checks if c[1] == "FAIL"], checks
    verdicts = {part: {v for p, v, _ in checks if p == part} for part in parts}
    for part in ("C0", "C1", "C2", "C3", "C4", "C5", "C7", "C9", "C10"):
        assert "PASS" in verdicts[part], (part, verdicts)
    assert verdicts["C8"] == {"PASS"}  # (a killed DDP rank over gloo: its trial runs again from its checkpoint)
    assert verdicts["C6"] == {"SKIP"}  # (a killed worker's GPU memory: a GPU only)
    assert any(p == "C2" and v == "PASS" and "LOCAL_RANK '0'" in text for p, v, text in checks), checks
    assert any(p == "C9" and "zero3-offload" in text and "bfloat16" in text for p, _, text in checks), checks
    assert any(p == "C10" and v == "PASS" and "ran zero3-offload" in text for p, v, text in checks), checks


@pytest.mark.launch
def test_the_two_gpu_parts_run_dry_on_two_cpu_devices(tmp_path):
    done, checks = _dry_run(tmp_path, "M1,M2,M3,M4", budget=150)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    verdicts = {part: {v for p, v, _ in checks if p == part} for part in ("M1", "M2", "M3", "M4")}
    assert verdicts == {"M1": {"PASS"}, "M2": {"PASS"}, "M3": {"PASS", "INFO"}, "M4": {"PASS"}}, checks


# -- what the check may take -------------------------------------------------------------------------------------
def _shell_defaults(text: str) -> dict[str, int]:
    found = dict(re.findall(r"\b([A-Z_]+)=(\d+)\b", text))
    found["BUDGET"] = re.search(r"BUDGET=\$\{GPU_CHECK_BUDGET:-(\d+)\}", text).group(1)
    return {k: int(v) for k, v in found.items()}


def test_the_check_with_its_set_up_fits_twice_in_a_lent_gpus_fifteen_minutes():
    """One command may run 600 s and a lent GPU gives 15 minutes in all: the default budget is at most 420 s, the
    caps of the default parts (header, set-up, review, summary) add up within it, and the review's parts on one GPU
    add up within the review's share."""
    defaults = _shell_defaults((GPU / "check.sh").read_text())
    assert defaults["BUDGET"] <= 420
    assert defaults["HEADER"] + defaults["SETUP_CAP"] + defaults["REVIEW_CAP"] + defaults["RESERVE"] <= 420
    assert defaults["REVIEW_CAP"] - 5 >= review_checks.ONE_GPU_SECONDS
    one_gpu = {name for name, part in review_checks.PARTS.items() if part.gpus == 1}
    assert one_gpu == {f"C{i}" for i in range(11)} - {"C8"}


def test_the_two_gpu_parts_say_skip_with_the_reason_on_one_gpu():
    part = review_checks.PARTS["M2"]
    assert review_checks.skipped("M2", part, dry=False, gpus=1) == "needs 2 GPUs, 1 seen"
    assert review_checks.skipped("M2", part, dry=False, gpus=2) is None
    assert review_checks.skipped("M2", part, dry=True, gpus=0) is None  # (two CPU devices over gloo)
    assert review_checks.skipped("C2", review_checks.PARTS["C2"], dry=False, gpus=1) is None


# -- the wheels ---------------------------------------------------------------------------------------------------
def _pins() -> dict[str, str]:
    lines = [line.strip() for line in (GPU / "wheels.txt").read_text().splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    unpinned = [line for line in lines if not re.fullmatch(r"[A-Za-z0-9_.-]+==[A-Za-z0-9_.+-]+", line)]
    assert not unpinned, f"wheels.txt: pin these as name==version: {unpinned}"
    return {_name(line.split("==")[0]): line.split("==")[1] for line in lines}


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_wheel_the_gpu_machine_installs_is_pinned_and_the_exact_pins_agree():
    """setup.sh installs the wheels with --no-deps: an unpinned pydantic-core released ahead of pydantic's pin would
    break ``import deepspeed`` there. Every line is pinned, pydantic's own dependencies are carried, and where a
    pinned package is installed here at its pin, each exact requirement it has on another pinned package is that
    package's pin."""
    pins = _pins()
    assert {"deepspeed", "pydantic", "pydantic-core", "typing-extensions", "annotated-types"} <= set(pins)
    for name, version in pins.items():
        try:
            distribution = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        if distribution.version != version:
            continue
        for requirement in distribution.requires or []:
            exact = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*==\s*([^;,\s]+)", requirement.strip())
            if exact and _name(exact.group(1)) in pins:
                assert pins[_name(exact.group(1))] == exact.group(2), (name, requirement)


def test_wheels_sh_takes_every_version_from_the_pinned_list():
    script = (GPU / "wheels.sh").read_text()
    assert "benchmarks/gpu/wheels.txt" in script
    assert not re.search(r"^\s+[a-z][a-z0-9_-]+( [a-z][a-z0-9_-]+)+\s*$", script, re.MULTILINE), "names outside it"


# -- what the check judges on a GPU ------------------------------------------------------------------------------
def test_a_cublas_workspace_is_no_leftover_and_any_allocated_byte_is():
    """On a GPU, cuBLAS's workspace (32 MiB on sm90) stays reserved from a worker's first product on: C2 clears
    the workspaces before reading what is allocated, and tolerates what stays reserved up to a stated bound."""
    workspace = {"alloc0": 0, "reserved0": 32 * MIB}
    assert checks_review.leftover_problems([{}, workspace, workspace]) == []
    assert checks_review.leftover_problems([{}, {"alloc0": 512, "reserved0": 32 * MIB}]) != []
    assert checks_review.leftover_problems([{}, {"alloc0": 0, "reserved0": 256 * MIB}]) != []


def test_a_trial_reads_what_its_gpu_holds_once_cublas_workspaces_are_cleared(monkeypatch):
    """The objective's own record, on a stand-in GPU whose allocator holds a 32 MiB workspace until
    ``torch._C._cuda_clearCublasWorkspaces`` runs."""
    held = {"bytes": 32 * MIB}
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: held.update(bytes=0), raising=False)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: held["bytes"])
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 32 * MIB)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (70 * 2**30, 80 * 2**30))
    attrs: dict = {}
    trial = types.SimpleNamespace(
        device=torch.device("cuda", 0), set_user_attr=lambda key, value: attrs.__setitem__(key, value)
    )
    review_objectives._entry_facts(trial)
    entry = attrs["entry"]
    assert (entry["alloc_raw"], entry["alloc0"], entry["reserved0"]) == (32 * MIB, 0, 32 * MIB)
    assert checks_review.leftover_problems([{}, entry]) == []


def test_a_trial_off_its_pool_entry_is_misplaced():
    """Each worker's mask is its pool entry: with the call that sets it taken out, a worker inherits the
    executor's mask (none on the device machine) and would run on whichever GPU CUDA lists first."""
    placed = {"visible": "1", "local_rank_env": "0", "current_device": 0}
    assert checks_common.placement_problems([placed], "1") == []
    assert checks_common.placement_problems([{**placed, "visible": None}], "1") != []
    assert checks_common.placement_problems([{**placed, "local_rank_env": "1"}], "1") != []
    assert checks_common.placement_problems([{**placed, "current_device": 1}], "1") != []
    assert checks_common.placement_problems([{"visible": "", "local_rank_env": "0", "current_device": -1}], "") == []


def test_a_deepspeed_that_does_not_import_fails_its_parts_with_the_reason(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(checks_common, "WORK", tmp_path)
    (tmp_path / checks_common.DEEPSPEED_IMPORT).write_text(
        '{"state": "broken", "reason": "import deepspeed: ImportError: pydantic-core 2.51 is not 2.50.5"}'
    )
    assert checks_common.without_deepspeed("C4", "a ZeRO-2 engine's release") is False
    assert "CHECK C4: FAIL a ZeRO-2 engine's release: import deepspeed: ImportError" in capsys.readouterr().out
    (tmp_path / checks_common.DEEPSPEED_IMPORT).write_text('{"state": "absent", "reason": "not installed"}')
    assert checks_common.without_deepspeed("C4", "a ZeRO-2 engine's release") is True
    assert "CHECK C4: SKIP" in capsys.readouterr().out
    (tmp_path / checks_common.DEEPSPEED_IMPORT).write_text('{"state": "ok", "reason": ""}')
    assert checks_common.without_deepspeed("C4", "a ZeRO-2 engine's release") is None
