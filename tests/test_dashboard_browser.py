"""The schedule chart really shows up in optuna-dashboard, in a real (headless) browser.

A sweep runs through the executor into SQLite with a DashboardPublisher; optuna-dashboard serves that storage on
127.0.0.1; headless Chromium (Debian's, driven by Selenium and chromium-driver) opens the study page
(``dashboard_page``). Every server is stopped by its PID. Install what this needs with `.ci/install-browser`.
Outside CI a missing browser skips the test; with CI=true it fails, so CI can never pass without having looked.
"""

from __future__ import annotations

from pathlib import Path

import objectives
import optuna
import pytest
from dashboard_page import CHART_ID, browser, schedule_chart, screenshot_of, served

from optuna_saturn import SaturnExecutor
from optuna_saturn.report import DashboardPublisher
from optuna_saturn.report.chart import TITLE

pytestmark = pytest.mark.launch


def test_schedule_chart_is_on_the_study_page(tmp_path: Path, saturn_options: dict) -> None:
    storage = f"sqlite:///{tmp_path / 'sweep.sqlite3'}"
    study = optuna.create_study(storage=storage, study_name="browser-check")
    publisher = DashboardPublisher(min_interval=0.0)
    executor = SaturnExecutor(devices=2, strategies=["single"], listeners=[publisher], **saturn_options)
    executor.optimize(study, objectives.curve, n_trials=3)
    assert publisher.published >= 2  # as the sweep went (its thread draws what changed), and at its end

    with served(storage) as base, browser(tmp_path / "chromium-profile") as driver:
        chart = schedule_chart(driver, base, study._study_id)
        text = chart.text
        title, subtitle = TITLE.removesuffix("</sup>").split("<br><sup>")
        assert title in text and subtitle in text
        fits = driver.execute_script(  # the title lies inside the chart's card (its edges clipped it)
            "const c = document.getElementById(arguments[0]); const t = c.querySelector('.g-gtitle text');"
            "const a = t.getBoundingClientRect(), b = c.getBoundingClientRect();"
            "return [a.width, a.right, b.right, a.top, b.top]",
            CHART_ID,
        )
        assert fits[0] > 0 and fits[1] <= fits[2] and fits[3] >= fits[4] + 4, fits
        assert "cpu:0" in text and "cpu:1" in text  # one row per device
        assert "makespan" in text and "lower bound" in text
        labels = driver.execute_script(  # the data plotly drew, as the browser holds it
            "return document.getElementById(arguments[0]).data.flatMap(t => t.text || [])", CHART_ID
        )
        expected = [f"#{t.number} single" for t in study.trials]  # (an outline is labelled only until it runs)
        assert sorted(set(labels) - {""}) == sorted(expected)  # what ran, labelled
        from selenium.webdriver.common.by import By

        bars = chart.find_elements(By.CSS_SELECTOR, "g.trace.bars g.point")
        assert len(bars) >= 2 * len(study.trials)  # an outline (planned) and a filled (actual) bar per trial
        assert "Saturn schedule" in driver.find_element(By.TAG_NAME, "body").text  # the plan note
        assert screenshot_of(driver, chart, tmp_path / "dashboard.png").stat().st_size > 10_000
