"""The schedule chart really shows up in optuna-dashboard, in a real (headless) browser.

A sweep runs through the executor into SQLite with a DashboardPublisher; optuna-dashboard serves that storage on
127.0.0.1; headless Chromium (Debian's, driven by Selenium and chromium-driver) opens the study page. Every
server is stopped by its PID. Install what this needs with `.ci/install-browser`. Outside CI a missing browser
skips the test; with CI=true it fails, so CI can never pass without having looked.
"""

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
from pathlib import Path

import objectives
import optuna
import psutil
import pytest
from support import require

from optuna_saturn import SaturnExecutor
from optuna_saturn.report import GRAPH_OBJECT_ID, DashboardPublisher
from optuna_saturn.report.chart import TITLE
from optuna_saturn.report.export import CHROMIUM_FLAGS

pytestmark = pytest.mark.launch

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
SCREENSHOT_COPY = os.environ.get("SATURN_DASHBOARD_SCREENSHOT")  # e.g. docs/dashboard.png, to refresh the docs


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


def wait_for_http(url: str, server: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"optuna-dashboard exited with {server.returncode}: {server.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"optuna-dashboard did not answer {url} within {timeout} s")


def test_schedule_chart_is_on_the_study_page(tmp_path: Path, saturn_options: dict) -> None:
    dashboard_cli = shutil.which("optuna-dashboard") or str(Path(sys.executable).with_name("optuna-dashboard"))
    require(Path(dashboard_cli).exists(), "optuna-dashboard")
    require(Path(CHROMIUM).exists(), f"Chromium ({CHROMIUM})")
    require(Path(CHROMEDRIVER).exists(), f"chromium-driver ({CHROMEDRIVER})")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait
    except ImportError:
        require(False, "selenium (pip)")

    storage = f"sqlite:///{tmp_path / 'sweep.sqlite3'}"
    study = optuna.create_study(storage=storage, study_name="browser-check")
    publisher = DashboardPublisher(min_interval=0.0)
    executor = SaturnExecutor(devices=2, strategies=["single"], listeners=[publisher], **saturn_options)
    executor.optimize(study, objectives.curve, n_trials=3)
    assert publisher.published >= 2  # as the sweep went (its thread draws what changed), and at its end

    port = free_port()
    server = subprocess.Popen(
        [dashboard_cli, storage, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    driver = None
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for_http(f"{base}/api/studies", server)
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1600,1100"):
            options.add_argument(flag)
        os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager look for drivers online
        driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
        driver.get(f"{base}/dashboard/studies/{study._study_id}")

        chart_id = f"user-defined-plot:{GRAPH_OBJECT_ID}"
        WebDriverWait(driver, 60).until(
            lambda d: (
                d.find_elements(By.ID, chart_id)
                and d.find_element(By.ID, chart_id).find_elements(By.CSS_SELECTOR, "svg.main-svg")
            )
        )
        chart = driver.find_element(By.ID, chart_id)
        text = chart.text
        title, subtitle = TITLE.removesuffix("</sup>").split("<br><sup>")
        assert title in text and subtitle in text
        fits = driver.execute_script(  # the title lies inside the chart's card (its edges clipped it)
            "const c = document.getElementById(arguments[0]); const t = c.querySelector('.g-gtitle text');"
            "const a = t.getBoundingClientRect(), b = c.getBoundingClientRect();"
            "return [a.width, a.right, b.right, a.top, b.top]",
            chart_id,
        )
        assert fits[0] > 0 and fits[1] <= fits[2] and fits[3] >= fits[4] + 4, fits
        assert "cpu:0" in text and "cpu:1" in text  # one row per device
        assert "makespan" in text and "lower bound" in text
        labels = driver.execute_script(  # the data plotly drew, as the browser holds it
            "return document.getElementById(arguments[0]).data.flatMap(t => t.text || [])", chart_id
        )
        expected = [f"#{t.number} single" for t in study.trials] + [f"#{t.number} planned" for t in study.trials]
        assert sorted(set(labels) - {""}) == sorted(expected)  # what ran, and the planned outlines, labelled
        bars = chart.find_elements(By.CSS_SELECTOR, "g.trace.bars g.point")
        assert len(bars) >= 2 * len(study.trials)  # an outline (planned) and a filled (actual) bar per trial
        assert "Saturn schedule" in driver.find_element(By.TAG_NAME, "body").text  # the plan note

        driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", chart)
        time.sleep(0.5)
        screenshot = tmp_path / "dashboard.png"
        assert driver.save_screenshot(str(screenshot))
        assert screenshot.stat().st_size > 10_000
        if SCREENSHOT_COPY:
            shutil.copyfile(screenshot, SCREENSHOT_COPY)
    finally:
        if driver is not None:
            driver_pid = driver.service.process.pid
            driver.quit()
            stop(driver_pid)
        stop(server.pid)
        assert server.poll() is not None
