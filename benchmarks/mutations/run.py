"""Apply each GPU-contract mutation to a copy of the repository, run the tests named for it there, and say which
test caught it (a mutation caught by no test is a fix no test guards).

    python benchmarks/mutations/run.py             # every mutation (about N minutes on 2 cores)
    python benchmarks/mutations/run.py --check     # only check that each mutation still applies (seconds)
    python benchmarks/mutations/run.py -k mask     # the mutations whose name contains "mask"
    python benchmarks/mutations/run.py --areas issue36,shared_node   # those two areas' modules

The copy is the repository's files as they are on disk (tracked and untracked, not ignored ones), in a temporary
folder, with ``PYTHONPATH`` pointing at it first, so the workers the tests start import the mutated package too.
First every named test runs once on an unmutated copy and must pass; a mutation counts as caught only where a
test then fails (pytest's exit code 1), not where pytest cannot even collect it. Prints a markdown table; exits 1
if any mutation is not caught or no longer applies, or a test fails unmutated.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from mutations import Mutation  # noqa: E402


def all_mutations(areas: list[str] | None = None) -> list[Mutation]:
    """Every area module's ``MUTATIONS`` (or those of ``areas``, module names), in module order."""
    import mutations

    found: list[Mutation] = []
    for info in sorted(pkgutil.iter_modules(mutations.__path__), key=lambda i: i.name):
        if info.name != "run" and (not areas or info.name in areas):
            found.extend(importlib.import_module(f"mutations.{info.name}").MUTATIONS)
    return found


def why_not_applicable(mutation: Mutation, root: Path) -> str | None:
    text = (root / mutation.path).read_text()
    count = text.count(mutation.old)
    return None if count == 1 else f"its text occurs {count} times in {mutation.path}"


def copy_of_repository() -> Path:
    """The tracked files (as on disk) in a fresh folder."""
    target = Path(tempfile.mkdtemp(prefix="saturn-mutation-"))
    command = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    listed = subprocess.run(command, cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def _pytest(test: str, copy: Path, timeout: float) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(copy), os.environ.get("PYTHONPATH", "")])}
    try:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *shlex.split(test)],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        ).returncode
    except subprocess.TimeoutExpired:
        return -1


def failing_unmutated(tests: set[str], *, timeout: float) -> dict[str, int]:
    """The named tests that do not pass on an unmutated copy, with pytest's exit code (-1: timed out)."""
    copy = copy_of_repository()
    try:
        codes = {test: _pytest(test, copy, timeout) for test in sorted(tests)}
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    return {test: code for test, code in codes.items() if code != 0}


def run_one(mutation: Mutation, *, timeout: float) -> tuple[str, str, float]:
    """(verdict, the test that caught it or why not, seconds)."""
    copy = copy_of_repository()
    started = time.monotonic()
    try:
        path = copy / mutation.path
        path.write_text(path.read_text().replace(mutation.old, mutation.new))
        problems = []
        for test in mutation.tests:
            code = _pytest(test, copy, timeout)
            if code == 1:
                return "caught", test, time.monotonic() - started
            if code != 0:
                problems.append(f"{test}: pytest exit code {code}" + (" (timed out)" if code == -1 else ""))
        return "NOT CAUGHT", "; ".join(problems) or "every named test passed", time.monotonic() - started
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check that each mutation applies")
    parser.add_argument(
        "-k", default="", help="only the mutations whose name contains this (or any of these, comma-separated)"
    )
    parser.add_argument("--areas", default="", help="only these areas' modules (comma-separated), e.g. issue36")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per test run")
    args = parser.parse_args()
    wanted = args.k.split(",")
    areas = [a for a in args.areas.split(",") if a]
    chosen = [m for m in all_mutations(areas) if any(w in m.name for w in wanted)]
    failed = False
    if not args.check:
        broken = failing_unmutated({t for m in chosen for t in m.tests}, timeout=args.timeout)
        for test, code in broken.items():
            print(f"unmutated, {test} does not pass (pytest exit code {code}): fix it first", flush=True)
        if broken:
            return 1
    print("| mutation | contract | verdict | caught by | seconds |\n|---|---|---|---|---|", flush=True)
    for mutation in chosen:
        problem = why_not_applicable(mutation, ROOT)
        if problem or args.check:
            failed |= problem is not None
            print(
                f"| {mutation.name} | {mutation.contract} | {'applies' if not problem else 'STALE'} | "
                f"{problem or '-'} | - |",
                flush=True,
            )
            continue
        verdict, by, seconds = run_one(mutation, timeout=args.timeout)
        failed |= verdict != "caught"
        print(f"| {mutation.name} | {mutation.contract} | {verdict} | `{by}` | {seconds:.0f} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
