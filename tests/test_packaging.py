"""The wheel users install holds every module of the source tree and every shipped strategy template (an editable
install, which the rest of the suite uses, cannot show a package missing from ``pyproject.toml``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_holds_every_module_and_template(tmp_path):
    # from a copy of what a source distribution holds: a build/ folder left by an earlier build would hide a
    # package missing from the list
    source = tmp_path / "source"
    for name in ("pyproject.toml", "README.md"):
        source.mkdir(exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("optuna_saturn", "strategies"):
        shutil.copytree(ROOT / folder, source / folder, ignore=ignore)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = tmp_path.glob("optuna_saturn-*.whl")
    inside = set(zipfile.ZipFile(wheel).namelist())

    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "optuna_saturn").rglob("*.py")}
    templates = {f"optuna_saturn/_builtin_strategies/{p.name}" for p in (ROOT / "strategies").glob("*.toml")}
    assert len(templates) >= 10
    missing = sorted((modules | templates) - inside)
    assert not missing, f"not in the wheel (add the package to [tool.setuptools] in pyproject.toml): {missing}"
    assert any(name.endswith("entry_points.txt") for name in inside)  # the optuna-saturn command


def test_ci_installs_and_tests_with_the_readmes_own_commands():
    """The README's first lines are what a new user copies: CI runs exactly them (``-q`` aside), so a command
    that stops working on a fresh machine fails CI, not the user."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    install, main_job, tests = (line.split("  #", 1)[0].strip() for line in block.strip().splitlines())
    assert main_job == "python examples/gpt2_sweep.py"
    assert "-e" not in install.split() and "[dev]" not in install, "the first install is a user's, not editable"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").replace(" -q ", " ")
    assert install in ci, f".ci/run does not run the README's install: {install}"
    for command in tests.split(" && "):
        assert command in ci, f".ci/run does not run the README's test line's {command!r}"


def test_the_licence_is_mit_and_no_doc_names_an_unserved_package():
    """pyproject.toml said MIT with no LICENSE file; the docs and a CLI error told users to install
    ``optuna-saturn[...]``, a name no package index serves (install from the clone, with extras)."""
    licence = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert licence.startswith("MIT License") and "WITHOUT WARRANTY OF ANY KIND" in licence
    assert (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").startswith("# Changelog")
    texts = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "optuna_saturn").rglob("*.py")]
    unserved = [str(p.relative_to(ROOT)) for p in texts if "optuna-saturn[" in p.read_text(encoding="utf-8")]
    assert not unserved, f"these name optuna-saturn[...], which no index serves: {unserved}"
