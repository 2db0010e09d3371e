"""The documentation's screenshots, taken with headless Chromium (issue 28):

- ``docs/site-home.png``: the documentation site's home page, as ``mkdocs build`` renders it;
- ``docs/site-ways-in.png``: the Lightning page of "Ways in", with its example rendered (issue 37: a formatter
  had turned the include into one line of text);
- ``docs/notebook-progress.png``: the live progress display of ``examples/notebook.ipynb``, as its sweep cell
  left it, from a real run of the notebook in a Jupyter kernel (nbclient; about two minutes on 2 cores). The
  notebook is saved back with that run's outputs, so GitHub shows what a run prints.

    unshare -n sh -c 'ip link set lo up && exec "$@"' sh python scripts/docs_screenshots.py [--only site|notebook]

(a loopback-only network namespace: the notebook's sweep starts process groups, DESIGN.md decision 9).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def site_pages(home: Path, ways_in: Path) -> None:
    from optuna_saturn.report.export import screenshot

    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", tmp],
            cwd=ROOT,
            check=True,
            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        )
        screenshot((Path(tmp) / "index.html").as_uri(), home, width=1280, height=900)
        page = (Path(tmp) / "ways-in" / "lightning" / "index.html").as_uri()
        screenshot(page, ways_in, width=1100, height=4200)  # (the whole page: the example is at its end)


def notebook_progress(out: Path) -> None:
    import nbclient
    import nbformat

    from optuna_saturn.report.export import screenshot

    notebook = nbformat.read(ROOT / "examples" / "notebook.ipynb", as_version=4)
    sweep = next(cell for cell in notebook.cells if "SaturnExecutor(" in cell.source)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "examples"), os.environ.get("PYTHONPATH", "")])
        nbclient.NotebookClient(notebook, timeout=900, resources={"metadata": {"path": tmp}}).execute()
        nbformat.write(notebook, ROOT / "examples" / "notebook.ipynb")  # (with this real run's outputs)
        table = next(o["data"]["text/html"] for o in sweep.outputs if "text/html" in o.get("data", {}))
        page = Path(tmp) / "progress.html"
        page.write_text(
            '<!doctype html><html><head><meta charset="utf-8"><style>body{margin:16px;background:#fff;'
            'font-family:"Source Code Pro",Menlo,monospace}</style></head>'
            f'<body><div class="jp-OutputArea-output">{table}</div></body></html>',
            encoding="utf-8",
        )
        screenshot(page.as_uri(), out, width=840, height=250)  # (the whole table, its last column too)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["site", "notebook"])
    args = parser.parse_args()
    if args.only in (None, "site"):
        site_pages(DOCS / "site-home.png", DOCS / "site-ways-in.png")
        print(f"wrote {DOCS / 'site-home.png'} and {DOCS / 'site-ways-in.png'}")
    if args.only in (None, "notebook"):
        notebook_progress(DOCS / "notebook-progress.png")
        print(f"wrote {DOCS / 'notebook-progress.png'} and examples/notebook.ipynb with its outputs")


if __name__ == "__main__":
    main()
