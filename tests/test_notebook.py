"""``examples/notebook.ipynb`` executed as a user runs it, headless (nbclient, a real Jupyter kernel): the objective
defined in a cell runs on the workers, every trial ends COMPLETE or PRUNED, the live progress table is updated in
place in the cell's output (and the last one stays), and the schedule is drawn inline."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support import require

pytestmark = pytest.mark.launch
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_the_notebook_runs_its_sweep_in_cells(tmp_path, monkeypatch):
    try:
        import nbclient
        import nbformat
    except ImportError:
        nbclient = nbformat = None
    require(nbclient is not None, "nbclient and nbformat", fix="install the dev extra: pip install -e '.[dev]'")
    notebook = nbformat.read(EXAMPLES / "notebook.ipynb", as_version=4)
    # The one change a test makes: the trials' process groups in loopback-only network namespaces (DESIGN.md,
    # decision 9); a user's notebook needs none.
    runs = [cell for cell in notebook.cells if "SaturnExecutor(devices=2," in cell.source]
    assert len(runs) == 1
    runs[0].source = runs[0].source.replace(
        "SaturnExecutor(devices=2,", "SaturnExecutor(isolate_network=True, devices=2,"
    )
    notebook.cells.append(
        nbformat.v4.new_code_cell("import json\nprint(json.dumps([t.state.name for t in study.trials]))")
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("SATURN_EXAMPLE_DATA", str(tmp_path / "data"))
    nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()

    states = json.loads(notebook.cells[-1].outputs[-1]["text"])
    assert len(states) == 4 and set(states) <= {"COMPLETE", "PRUNED"} and "COMPLETE" in states, states
    tables = [o for o in runs[0].outputs if "text/html" in o.get("data", {})]
    assert len(tables) == 1  # one display, updated in place: not a new output per refresh
    final = tables[0]["data"]["text/html"]
    assert "optuna-saturn: study &#x27;notebook-gpt2&#x27;" in final or "optuna-saturn: study 'notebook-gpt2'" in final
    assert final.count("COMPLETE") + final.count("PRUNED") >= 4 and "RUNNING" not in final
    schedule = notebook.cells[-2].outputs
    assert any(
        "application/vnd.plotly.v1+json" in o.get("data", {}) or "text/html" in o.get("data", {}) for o in schedule
    ), schedule


def test_the_notebook_is_saved_with_the_outputs_of_a_real_run():
    """GitHub and a reader's Jupyter show what a run prints before anyone runs it (scripts/docs_screenshots.py
    saves it after a real run)."""
    import nbformat

    notebook = nbformat.read(EXAMPLES / "notebook.ipynb", as_version=4)
    sweep = next(cell for cell in notebook.cells if "SaturnExecutor(" in cell.source)
    tables = [o["data"]["text/html"] for o in sweep.outputs if "text/html" in o.get("data", {})]
    assert tables and "COMPLETE" in tables[-1] and "RUNNING" not in tables[-1]
    shown = [
        c for c in notebook.cells if c.cell_type == "code" and ("plot_schedule(" in c.source or "dataframe" in c.source)
    ]
    assert shown and all(cell.get("outputs") for cell in shown)  # the trials' table and the schedule chart
