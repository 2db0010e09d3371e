"""The GPU review's check script (benchmarks/gpu/review_checks.py) is ready before a GPU is lent: its dry run on
CPU devices goes through every part, each part that can run on CPU passes, and the parts that need a GPU say so."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.launch

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu" / "review_checks.py"


def test_the_dry_run_goes_through_every_part_and_passes_what_a_cpu_can_check(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry", "--budget", "460"],
        env={**os.environ, "GPU_CHECK_WORK": str(tmp_path / "work"), "SATURN_EXAMPLE_DATA": str(tmp_path / "data")},
        capture_output=True,
        text=True,
        timeout=660,
    )
    summary = done.stdout.split("===== SUMMARY", 1)[-1]
    checks = re.findall(r"^CHECK (C\d): (PASS|FAIL|INFO|SKIP)(.*)$", summary, re.MULTILINE)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert {part for part, _, _ in checks} == {f"C{i}" for i in range(9)}, summary
    assert not [c for c in checks if c[1] == "FAIL"], summary
    verdicts = {part: {v for p, v, _ in checks if p == part} for part in {p for p, _, _ in checks}}
    assert "PASS" in verdicts["C1"] and "PASS" in verdicts["C2"] and "PASS" in verdicts["C3"], verdicts
    assert "PASS" in verdicts["C4"] and "PASS" in verdicts["C5"] and "PASS" in verdicts["C7"], verdicts
    assert verdicts["C8"] == {"PASS"}  # (a killed DDP rank over gloo: its trial runs again from its checkpoint)
    assert verdicts["C6"] == {"SKIP"}  # (a killed worker's GPU memory: a GPU only)
