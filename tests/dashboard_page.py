"""optuna-dashboard in a real (headless) browser, for the browser test and the docs' screenshot
(``scripts/dashboard_screenshot.py``): the dashboard served on 127.0.0.1, Debian's Chromium driven by Selenium and
chromium-driver, every process stopped by its PID. Install what this needs with ``.ci/install-browser``."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from support import require

from optuna_saturn.report import GRAPH_OBJECT_ID
from optuna_saturn.report.export import CHROMIUM_FLAGS

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
#: The schedule chart's element on the study page.
CHART_ID = f"user-defined-plot:{GRAPH_OBJECT_ID}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(pid: int) -> None:
    """SIGTERM the process ``pid`` and its children, SIGKILL what is left after 10 s, and check they are gone."""
    try:
        process = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    family = [process, *process.children(recursive=True)]
    for p in family:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGTERM)
    _, alive = psutil.wait_procs(family, timeout=10)
    for p in alive:
        os.kill(p.pid, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=5)
    assert not [p.pid for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _wait_for_http(url: str, server: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"optuna-dashboard exited with {server.returncode}: {server.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"optuna-dashboard did not answer {url} within {timeout} s")


@contextlib.contextmanager
def served(storage: str) -> Iterator[str]:
    """optuna-dashboard serving ``storage`` on 127.0.0.1: its base URL; stopped by its PID afterwards."""
    dashboard_cli = shutil.which("optuna-dashboard") or str(Path(sys.executable).with_name("optuna-dashboard"))
    require(Path(dashboard_cli).exists(), "optuna-dashboard")
    port = free_port()
    server = subprocess.Popen(
        [dashboard_cli, storage, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_for_http(f"{base}/api/studies", server)
        yield base
    finally:
        stop(server.pid)
        assert server.poll() is not None


@contextlib.contextmanager
def browser(profile: Path, *, width: int = 1600, height: int = 1100) -> Iterator[Any]:
    """A headless Chromium driven by Selenium (its profile in ``profile``); quit and stopped afterwards."""
    require(Path(CHROMIUM).exists(), f"Chromium ({CHROMIUM})")
    require(Path(CHROMEDRIVER).exists(), f"chromium-driver ({CHROMEDRIVER})")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        require(False, "selenium (pip)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager look for drivers online
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver_pid = driver.service.process.pid
        driver.quit()
        stop(driver_pid)


def schedule_chart(driver: Any, base: str, study_id: int) -> Any:
    """The study page's schedule chart, once plotly drew it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{base}/dashboard/studies/{study_id}")
    WebDriverWait(driver, 60).until(
        lambda d: (
            d.find_elements(By.ID, CHART_ID)
            and d.find_element(By.ID, CHART_ID).find_elements(By.CSS_SELECTOR, "svg.main-svg")
        )
    )
    return driver.find_element(By.ID, CHART_ID)


def screenshot_of(driver: Any, chart: Any, path: Path) -> Path:
    """The page with ``chart`` in the middle of the window, saved to ``path``."""
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", chart)
    time.sleep(0.5)
    assert driver.save_screenshot(str(path))
    return path
