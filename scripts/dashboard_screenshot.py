"""``docs/dashboard.png``: the schedule chart in optuna-dashboard, from the README's own main job.

Runs ``python examples/gpt2_sweep.py`` (8 tiny GPT-2 trials on 2 CPU devices, about 3 minutes on 2 cores) into a
fresh SQLite file, serves it with optuna-dashboard on 127.0.0.1, opens the study page in headless Chromium, and
saves the page with the schedule chart in view (``tests/dashboard_page.py`` drives the browser, as the browser
test does). Look at the picture before committing it.

    unshare -n sh -c 'ip link set lo up && exec "$@"' sh python scripts/dashboard_screenshot.py [--out PATH]

(a loopback-only network namespace: the sweep's ``ddp`` trials start process groups, DESIGN.md decision 9).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    import optuna
    from dashboard_page import browser, schedule_chart, screenshot_of, served

    with tempfile.TemporaryDirectory() as tmp:
        storage = f"sqlite:///{tmp}/saturn-example.sqlite3"
        subprocess.run([sys.executable, "examples/gpt2_sweep.py", "--storage", storage], cwd=ROOT, check=True)
        study = optuna.load_study(study_name="gpt2-tiny", storage=storage)
        with served(storage) as base, browser(Path(tmp) / "chromium-profile", width=1600, height=1000) as driver:
            chart = schedule_chart(driver, base, study._study_id)
            screenshot_of(driver, chart, args.out)
    print(f"wrote {args.out}: study gpt2-tiny, {len(study.trials)} trials")


if __name__ == "__main__":
    main()
