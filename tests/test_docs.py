"""The documentation site (``mkdocs.yml``, ``docs/``) covers what the package offers and builds without a warning:
every public name has its API entry, every page is in the navigation and every navigation entry is a page, every
command-line option is documented, and ``mkdocs build --strict`` passes (broken links and anchors, missing
snippets and docstrings mkdocstrings cannot parse all fail it). No page carries the developers' notes of their own
process (a numbered work item or session): the pages show the sweep, not its makers."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from html import unescape
from pathlib import Path

import yaml
from support import require

import optuna_saturn

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _config() -> dict:
    # BaseLoader: mkdocs.yml may hold tags (!!python/name, !ENV) that only mkdocs resolves; we need its structure
    return yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=yaml.BaseLoader)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # (a parent package is missing)
        return False


def _nav_pages(entries: list) -> list[str]:
    pages: list[str] = []
    for entry in entries:
        if isinstance(entry, str):
            pages.append(entry)
        elif isinstance(entry, dict):
            for value in entry.values():
                pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return [p for p in pages if "://" not in p]  # (links out of the site are not pages)


def test_every_public_name_has_an_api_entry():
    documented = set(
        re.findall(r"^::: optuna_saturn\.(\S+)\s*$", (DOCS / "api.md").read_text(encoding="utf-8"), re.MULTILINE)
    )
    missing = sorted(set(optuna_saturn.__all__) - documented)
    assert not missing, f"add a `::: optuna_saturn.<name>` entry to docs/api.md for {missing}"


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    config = _config()
    assert config.get("docs_dir", "docs") == "docs"
    nav = _nav_pages(config["nav"])
    assert len(nav) == len(set(nav)), f"a page is in the nav twice: {sorted(nav)}"
    pages = {
        p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if not p.relative_to(DOCS).parts[0].startswith("_")
    }
    assert not sorted(set(nav) - pages), f"nav entries without a page in docs/: {sorted(set(nav) - pages)}"
    assert not sorted(pages - set(nav)), f"pages in docs/ missing from mkdocs.yml's nav: {sorted(pages - set(nav))}"


def test_every_command_line_option_is_documented():
    import typer.main

    from optuna_saturn.cli import app

    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    sections = dict(zip(*[iter(re.split(r"^## `optuna-saturn (\S+)`$", text, flags=re.MULTILINE)[1:])] * 2))
    missing = []
    for name, command in typer.main.get_command(app).commands.items():
        if name not in sections:
            missing.append(f"a section '## `optuna-saturn {name}`'")
            continue
        for param in command.params:
            for flag in [*param.opts, *param.secondary_opts]:
                if (
                    flag.startswith("-")
                    and flag != "--help"
                    and not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", sections[name])
                ):
                    missing.append(f"{name} {flag}")
    assert not missing, f"docs/cli.md does not document: {missing}"


def test_the_site_builds_strictly(tmp_path):
    modules = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python", "pymdownx")
    require(
        all(_installed(m) for m in modules),
        "mkdocs, mkdocs-material and mkdocstrings[python]",
        fix="install the dev extra: pip install -e '.[dev]'",
    )
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # (Material's banner about its successor)
    )
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    for name in optuna_saturn.__all__:
        assert f'id="optuna_saturn.{name}"' in api, f"the API page renders no entry for {name}"
    # the docstrings' Sphinx roles (:class:`~x.Y`) read as code, not as a role's name before it (docs/_hooks)
    pages = "".join(p.read_text(encoding="utf-8") for p in (tmp_path / "site").rglob("*.html"))
    assert not re.findall(r":(?:mod|class|func|meth|data|attr|exc):<code>", pages)
    assert "<code>SweepListener</code>" in api
    _pages_show_what_they_promise(tmp_path / "site")


#: Each "Ways in" page shows its example file whole (included from examples/, so the two cannot differ).
WAYS_IN_EXAMPLES = {
    "plain-loop": "gpt2_sweep.py",
    "trainer": "hf_trainer_sweep.py",
    "accelerate": "accelerate_sweep.py",
    "lightning": "lightning_sweep.py",
}


def _pages_show_what_they_promise(site: Path) -> None:
    """Included examples really render (a formatter once turned each include marker into an expression, and the
    pages showed that one line), and no page shows markup of another format as text: an include marker, a
    Sphinx role, or a reST literal marker (a paragraph ending in "::")."""
    for page, example in WAYS_IN_EXAMPLES.items():
        html = (site / "ways-in" / page / "index.html").read_text(encoding="utf-8")
        source = (ROOT / "examples" / example).read_text(encoding="utf-8")
        assert "def objective" in source
        text = unescape(re.sub(r"<[^>]+>", "", html))  # (highlighted code is split into spans)
        assert "def objective(" in text, f"the {page} page does not show examples/{example}"
        assert source.splitlines()[-1].strip() in text, f"the {page} page shows only part of examples/{example}"
    for path in site.rglob("*.html"):
        text = unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8")))
        where = path.relative_to(site).as_posix()
        assert not re.search(r"--8\s*<\s*--", text), f"{where} shows an include marker instead of the file"
        assert not re.search(r":(?:mod|class|func|meth|data|attr|exc|obj|ref):`", text), f"{where}: a Sphinx role"
        assert not re.search(r"\w::\s*$", text, re.MULTILINE), f"{where}: a reST '::' marker shown as text"


def test_the_command_lines_page_names_every_solver():
    from optuna_saturn.planner import SOLVERS

    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    solver_line = text[text.index("- `--solver`") :].split("\n- ", 1)[0]
    missing = [name for name in SOLVERS if f"`{name}`" not in solver_line]
    assert not missing, f"docs/cli.md's --solver does not name {missing}"


#: A note of the developers' process (a numbered work item or session) that has no place on a user's page.
INTERNAL_NOTE = re.compile(r"\b(?:[Ss]top|[Ii]ssue)s? \d+\b|test collection of mine")


def _included(path: Path) -> list[Path]:
    """The files a page pulls in with pymdownx.snippets' ``--8<-- "file"`` (a line range or a section after a
    colon), relative to the repository root (mkdocs.yml's base_path)."""
    names = re.findall(r'--8<--\s+"([^"]+)"', path.read_text(encoding="utf-8"))
    return [ROOT / re.sub(r":[^/\\]*$", "", name) for name in names]


def _page_sources() -> list[Path]:
    """Every Markdown source that becomes a page or is shown on one: README.md (GitHub's front page), docs/,
    benchmarks/README.md, and each file they include, followed through includes of includes."""
    sources = [ROOT / "README.md", *sorted(DOCS.rglob("*.md")), ROOT / "benchmarks" / "README.md"]
    seen: set[Path] = set()
    while sources:
        path = sources.pop(0).resolve()
        if path in seen:
            continue
        seen.add(path)
        sources.extend(_included(path))
    return sorted(seen)


def test_no_page_carries_internal_notes():
    notes: list[str] = []
    for path in _page_sources():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for match in INTERNAL_NOTE.finditer(line):
                notes.append(f"{path.relative_to(ROOT).as_posix()}:{number}: {match.group(0)!r}")
    assert not notes, "reword these developers' notes (say what was done and how, not in which work item):\n" + (
        "\n".join(notes)
    )
