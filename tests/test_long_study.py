"""A long study costs what a short one does: what a trial records is bounded (devices by reference, a capped
price history), and the pricer's history is a window whose medians are computed once per change (reliability
review, finding 3 and its resource bounds). The loop's time per event against a study of 20,000 trials is
measured in ``benchmarks/long_study.py``."""

from __future__ import annotations

import json
import random

import optuna

from optuna_saturn.planner import Cluster
from optuna_saturn.pricing.learned import LearnedOverheads
from optuna_saturn.pricing.step_time_model import POINTS_PER_FAMILY, CostModel, Work
from optuna_saturn.simulation.simulator import run_simulation
from optuna_saturn.sweep.run_attrs import KEPT_PRICES, kept_prices

try:
    from test_scheduler import job, study_of
except ImportError:  # tests/ imported as a package
    from tests.test_scheduler import job, study_of


def _saturn_bytes(trial: optuna.trial.FrozenTrial) -> int:
    return sum(
        len(json.dumps(v)) for k, v in {**trial.user_attrs, **trial.system_attrs}.items() if k.startswith("saturn:")
    )


def test_a_trial_records_at_most_4_kib_and_the_pool_once_on_64_devices():
    """``saturn:pool`` listed all 64 devices on every trial (73 MiB over 100,000 trials); one trial per pool
    carries it now, and a trial's attributes stay within 4 KiB."""
    rng = random.Random(0)
    jobs = [
        job(f"t{i}", *((("ddp" if d > 1 else "single"), d, rng.uniform(600, 3600) / d**0.8) for d in (1, 2, 4, 8)))
        for i in range(40)
    ]
    study = study_of(jobs)
    run_simulation(jobs, Cluster([8] * 8), study=study, solver="list")
    ended = [t for t in study.trials if t.state.is_finished()]
    assert len(ended) == 40
    sizes = [_saturn_bytes(t) for t in ended]
    assert max(sizes) <= 4096, sorted(sizes)[-3:]
    carriers = [t for t in ended if "saturn:pool" in t.system_attrs]
    assert len(carriers) == 1 and len(carriers[0].system_attrs["saturn:pool"]) == 64


def test_a_trials_price_history_keeps_its_first_and_latest_prices():
    prices = [[i, [f"option-{i}"]] for i in range(1000)]
    kept = kept_prices(prices)
    assert len(kept) == KEPT_PRICES and kept[0] == prices[0] and kept[-1] == prices[-1]
    assert kept_prices(prices[:3]) == prices[:3]


def test_the_pricers_history_is_a_window_with_medians_computed_once_per_change():
    class Record:
        def __init__(self, startup: float) -> None:
            self.startup_seconds, self.after_loop_seconds = startup, 1.0

    learned = LearnedOverheads(window=3)
    for startup in (100.0, 1.0, 2.0, 3.0):
        learned.add(Record(startup))
    assert len(learned) == 3 and learned.overheads() == (2.0, 1.0)  # the oldest (100 s) left the window
    learned._records.append(Record(50.0))  # (behind its back: the cached medians stand until the next add)
    assert learned.overheads() == (2.0, 1.0)


def test_a_cost_model_family_keeps_its_latest_workloads():
    model = CostModel()
    family = ("ddp", 2, 1)
    for i in range(POINTS_PER_FAMILY + 10):
        model.observe(family, Work(float(i + 1), 1.0), 0.1)
    assert model.measured(family, Work(1.0, 1.0)) is None  # the oldest left
    assert model.measured(family, Work(float(POINTS_PER_FAMILY + 10), 1.0)) == 0.1
