"""The documentation's screenshots, taken with headless Chromium (issue 28):

- ``docs/site-home.png``: the documentation site's home page, as ``mkdocs build`` renders it;
- ``docs/notebook-progress.png``: the live progress display of ``examples/notebook.ipynb``, as its sweep cell
  left it, from a real run of the notebook in a Jupyter kernel (nbclient; about two minutes on 2 cores).

    python scripts/docs_screenshots.py [--only site|notebook]
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


def site_home(out: Path) -> None:
    from optuna_saturn.report.export import screenshot

    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", tmp],
            cwd=ROOT,
            check=True,
            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        )
        screenshot((Path(tmp) / "index.html").as_uri(), out, width=1280, height=900)


def notebook_progress(out: Path) -> None:
    import nbclient
    import nbformat

    from optuna_saturn.report.export import screenshot

    notebook = nbformat.read(ROOT / "examples" / "notebook.ipynb", as_version=4)
    sweep = next(cell for cell in notebook.cells if "SaturnExecutor(" in cell.source)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "examples"), os.environ.get("PYTHONPATH", "")])
        nbclient.NotebookClient(notebook, timeout=900, resources={"metadata": {"path": tmp}}).execute()
        table = next(o["data"]["text/html"] for o in sweep.outputs if "text/html" in o.get("data", {}))
        page = Path(tmp) / "progress.html"
        page.write_text(
            '<!doctype html><html><head><meta charset="utf-8"><style>body{margin:16px;background:#fff;'
            'font-family:"Source Code Pro",Menlo,monospace}</style></head>'
            f'<body><div class="jp-OutputArea-output">{table}</div></body></html>',
            encoding="utf-8",
        )
        screenshot(page.as_uri(), out, width=760, height=250)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["site", "notebook"])
    args = parser.parse_args()
    if args.only in (None, "site"):
        site_home(DOCS / "site-home.png")
        print(f"wrote {DOCS / 'site-home.png'}")
    if args.only in (None, "notebook"):
        notebook_progress(DOCS / "notebook-progress.png")
        print(f"wrote {DOCS / 'notebook-progress.png'}")


if __name__ == "__main__":
    main()
