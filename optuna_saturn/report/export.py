"""Write the chart to files: self-contained HTML (works offline) and PNG.

PNG goes through kaleido (plotly's exporter, which drives a local Chrome/Chromium) when it is installed; without
it, a headless Chromium screenshot of the HTML does the same job. Either way nothing is fetched from the network:
the HTML embeds plotly.js. Kaleido runs in a process of its own with a time limit: its browser has been seen to
hang for good (a CI run waited on it), and a report must not.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import plotly.graph_objects as go

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
# Flags for a headless Chromium that talks to nobody: no sandbox (root in containers), no background traffic.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


#: How long kaleido may take for one PNG before the Chromium screenshot is used instead.
KALEIDO_SECONDS = 90.0

_KALEIDO = """
import sys
import plotly.io
figure = plotly.io.read_json(sys.argv[1])
figure.write_image(sys.argv[2], format="png", width=int(sys.argv[3]), height=int(sys.argv[4]))
"""


class ExportError(RuntimeError):
    """A PNG could not be written; the message names what to install."""


def write_html(fig: go.Figure, path: str | os.PathLike) -> Path:
    """A single HTML file with plotly.js inside, so it opens without a network."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(path, include_plotlyjs=True, full_html=True)
    return path


def write_png(fig: go.Figure, path: str | os.PathLike, *, width: int = 1200, height: int | None = None) -> str:
    """Write ``fig`` as PNG; returns how (``"kaleido"`` or ``"chromium"``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    height = height or int(fig.layout.height or 500)
    try:
        import kaleido  # noqa: F401
    except ImportError:
        kaleido_error: Exception | None = None
    else:
        try:
            _kaleido_png(fig, path, width=width, height=height)
            return "kaleido"
        except (subprocess.SubprocessError, OSError) as exc:  # e.g. kaleido finds no Chrome: Chromium directly
            kaleido_error = exc
    browser = find_chromium()
    if browser is None:
        hint = f" (kaleido failed: {kaleido_error})" if kaleido_error else ""
        raise ExportError(
            f"Cannot write PNG{hint}: install kaleido (pip install kaleido) with Chrome/Chromium, or Chromium "
            "(e.g. apt-get install chromium). The HTML report does not need either."
        )
    _chromium_screenshot(browser, fig, path, width=width, height=height)
    return "chromium"


def _kaleido_png(fig: go.Figure, path: Path, *, width: int, height: int) -> None:
    """``fig.write_image``, in a process group of its own (kaleido's browser with it), killed after
    :data:`KALEIDO_SECONDS`."""
    with tempfile.TemporaryDirectory(prefix="saturn-kaleido-") as tmp:
        figure = Path(tmp) / "figure.json"
        figure.write_text(fig.to_json(), encoding="utf-8")
        process = subprocess.Popen(
            [sys.executable, "-c", _KALEIDO, str(figure), str(path), str(width), str(height)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            _, errors = process.communicate(timeout=KALEIDO_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
        if process.returncode != 0 or not path.exists():
            raise subprocess.SubprocessError(errors.strip()[-500:] or f"exit code {process.returncode}")


def find_chromium() -> str | None:
    """The first Chrome/Chromium on PATH (``$CHROMIUM`` wins when set)."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    return next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)


def _chromium_screenshot(browser: str, fig: go.Figure, path: Path, *, width: int, height: int) -> None:
    with tempfile.TemporaryDirectory(prefix="saturn-png-") as tmp:
        page = write_html(go.Figure(fig).update_layout(width=width, height=height), Path(tmp) / "chart.html")
        screenshot(page.resolve().as_uri(), path, width=width, height=height, browser=browser)


def screenshot(url: str, path: str | os.PathLike, *, width: int, height: int, browser: str | None = None) -> Path:
    """A PNG of the page at ``url`` as headless Chromium renders it in a ``width`` x ``height`` window."""
    browser = browser or find_chromium()
    if browser is None:
        raise ExportError("Cannot take a screenshot: install Chromium (e.g. apt-get install chromium).")
    path = Path(path)
    with tempfile.TemporaryDirectory(prefix="saturn-shot-") as tmp:
        command = [
            browser,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp}/profile",
            f"--window-size={width},{height}",
            f"--screenshot={path.resolve()}",
            url,
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0 or not path.exists():
            raise ExportError(f"Chromium could not write {path}: {result.stderr.strip()[-500:]}")
    return path
