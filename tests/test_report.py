"""The schedule chart, the summary and note, the dashboard publisher, export, and the progress views.

Studies here are built from trials with the ``saturn:*`` user attributes the sweep writes (see _sweep.py), so each
number in the chart can be checked against a number we put in. Real sweeps are in test_cli.py and
test_dashboard_browser.py.
"""

from __future__ import annotations

import importlib.util
import io
import logging
import sys
import threading
import time

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState
from rich.console import Console
from support import require

from optuna_saturn.events import TrialProgress, TrialStart
from optuna_saturn.planner import Assignment, Option, Plan
from optuna_saturn.progress import (
    PlainProgress,
    QuietProgress,
    RichProgress,
    SweepTracker,
    format_duration,
    make_progress,
)
from optuna_saturn.report import (
    GRAPH_OBJECT_ID,
    DashboardPublisher,
    format_summary,
    plan_note,
    publish,
    read_study,
    schedule_figure,
    summarize,
    write_html,
    write_png,
)
from optuna_saturn.report.chart import PLANNED_NAME, STATE_COLOURS

T0 = 1_800_000_000.0
OPTIONS = [{"strategy": "single", "devices": 1, "runtime": 10.0}, {"strategy": "ddp", "devices": 2, "runtime": 6.0}]


def saturn_trial(
    number: int,
    state: TrialState,
    strategy: str,
    device_ids: list[int],
    planned: tuple[float, float],
    actual: tuple[float, float],
    *,
    started: float = T0,
    options: list[dict] = OPTIONS,
    value: float | None = 1.0,
    profiling: list[dict] | None = None,
) -> optuna.trial.FrozenTrial:
    """A finished trial as the sweep records it (times in seconds since the sweep started)."""
    attrs = {
        "strategy": strategy,
        "num_devices": len(device_ids),
        "devices": [f"cpu:{i}" for i in device_ids],
        "device_ids": device_ids,
        "planned_start": planned[0],
        "planned_end": planned[1],
        "planned_runtime": planned[1] - planned[0],
        "actual_start": actual[0],
        "actual_end": actual[1],
        "actual_runtime": actual[1] - actual[0],
        "sweep_started_at": started,
        "options": options,
    }
    if profiling is not None:
        attrs["profiling"] = profiling
    if state == TrialState.FAIL:
        attrs["fail_reason"] = f"rank 0: ValueError: trial {number} went wrong\nTraceback (most recent call last): ..."
    trial = optuna.trial.create_trial(
        state=state,
        value=value if state == TrialState.COMPLETE else None,
        params={"lr": 0.01 * (number + 1)},
        distributions={"lr": FloatDistribution(1e-4, 1.0)},
        system_attrs={"saturn:" + k: v for k, v in attrs.items()},  # (the sweep's records: system attributes)
    )
    trial.number = number
    return trial


def make_study(trials: list[optuna.trial.FrozenTrial]) -> optuna.Study:
    study = optuna.create_study()
    for trial in trials:
        study.add_trial(trial)
    return study


@pytest.fixture
def study() -> optuna.Study:
    """Four trials on a pool of 4 CPU devices (cpu:2 never used): one on two devices, one pruned, one failed."""
    return make_study(
        [
            saturn_trial(0, TrialState.COMPLETE, "single", [0], (0.0, 10.0), (0.5, 12.0)),
            saturn_trial(1, TrialState.COMPLETE, "ddp", [1, 3], (0.0, 6.0), (0.4, 7.0)),
            saturn_trial(2, TrialState.PRUNED, "single", [1], (6.0, 16.0), (7.2, 9.0)),
            saturn_trial(3, TrialState.FAIL, "single", [0], (10.0, 20.0), (12.1, 12.5)),
        ]
    )


def bars(fig, name: str) -> list[tuple[str, float, float]]:
    """(device row, start, length) of every bar of the trace called ``name``, to the microsecond."""
    (trace,) = [t for t in fig.data if t.name == name]
    rows = zip(trace.y, trace.base, trace.x, strict=True)
    return sorted((y, round(base, 6), round(length, 6)) for y, base, length in rows)


def shapes(fig) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    for shape in fig.layout.shapes:
        found.setdefault(shape.name, []).append(round(shape.x0, 6))
    return found


# -- chart ---------------------------------------------------------------------------------------------------------
def test_one_row_per_device_used(study: optuna.Study) -> None:
    fig = schedule_figure(read_study(study))
    rows = ["cpu:0", "cpu:1", "cpu:3"]  # cpu:2 ran nothing, so it has no row
    assert list(fig.layout.yaxis.categoryarray) == rows
    assert {y for trace in fig.data for y in trace.y} == set(rows)


def test_profiling_launches_are_drawn_on_the_devices_they_used() -> None:
    profiled = make_study(
        [
            saturn_trial(
                0,
                TrialState.COMPLETE,
                "single",
                [0],
                (9.0, 19.0),
                (9.5, 20.0),
                profiling=[
                    {"option": "fsdp+ddpx2", "devices": ["cpu:0", "cpu:1"], "start": 0.0, "end": 4.5},
                    {"option": "singlex1", "devices": ["cpu:0"], "start": 4.6, "end": 8.0},
                ],
            )
        ]
    )
    (record,) = read_study(profiled)
    fig = schedule_figure([record])
    assert bars(fig, "profiling") == [("cpu:0", 0.0, 4.5), ("cpu:0", 4.6, 3.4), ("cpu:1", 0.0, 4.5)]
    # the summary counts the devices' time in profiling beside the trials' (pool of 2 inferred, makespan 20 s)
    assert summarize(record).profiling_share == pytest.approx((2 * 4.5 + 3.4) / (2 * 20.0))
    assert summarize(record).utilisation == pytest.approx(10.5 / (2 * 20.0))
    assert "31% profiled them" in format_summary([record])
    assert list(fig.layout.yaxis.categoryarray) == ["cpu:0", "cpu:1"]  # a device used only for profiling has a row
    assert not [
        t
        for t in schedule_figure(
            read_study(make_study([saturn_trial(0, TrialState.COMPLETE, "single", [0], (0.0, 10.0), (0.5, 12.0))]))
        ).data
        if t.name == "profiling"
    ]


def test_bars_match_actual_times_and_are_coloured_by_state(study: optuna.Study) -> None:
    fig = schedule_figure(read_study(study))
    assert bars(fig, "COMPLETE") == [
        ("cpu:0", 0.5, 11.5),
        ("cpu:1", 0.4, 6.6),
        ("cpu:3", 0.4, 6.6),  # trial 1 has a bar on both its devices
    ]
    assert bars(fig, "PRUNED") == [("cpu:1", 7.2, 1.8)]
    assert bars(fig, "FAIL") == [("cpu:0", 12.1, 0.4)]
    for state in ("COMPLETE", "PRUNED", "FAIL"):
        (trace,) = [t for t in fig.data if t.name == state]
        assert trace.marker.color == STATE_COLOURS[state]
    (complete,) = [t for t in fig.data if t.name == "COMPLETE"]
    assert "#1 ddp" in complete.text
    assert any("strategy ddp on cpu:1, cpu:3" in h and "lr = 0.02" in h for h in complete.hovertext)


def test_planned_bars_are_transparent_outlines(study: optuna.Study) -> None:
    fig = schedule_figure(read_study(study))
    assert bars(fig, PLANNED_NAME) == [
        ("cpu:0", 0.0, 10.0),
        ("cpu:0", 10.0, 10.0),
        ("cpu:1", 0.0, 6.0),
        ("cpu:1", 6.0, 10.0),
        ("cpu:3", 0.0, 6.0),
    ]
    (planned,) = [t for t in fig.data if t.name == PLANNED_NAME]
    assert planned.marker.color == "rgba(0,0,0,0)" and planned.marker.line.width > 0
    # every trial here ran: its own bar names it, and its outline carries no label to run into the next bar's
    assert set(planned.text) == {""}
    # labels sit inside their bars, and one that does not fit is hidden rather than drawn over its neighbour
    assert {t.textposition for t in fig.data if t.type == "bar"} == {"inside"}
    assert fig.layout.uniformtext.mode == "hide"


def test_makespan_and_lower_bound_lines() -> None:
    # Two single-device trials of 10 s and 20 s on 2 devices: no plan beats 20 s, and this one took 21 s.
    only_single = [{"strategy": "single", "devices": 1, "runtime": 10.0}]
    study = make_study(
        [
            saturn_trial(0, TrialState.COMPLETE, "single", [0], (0.0, 10.0), (0.0, 10.0), options=only_single),
            saturn_trial(1, TrialState.COMPLETE, "single", [1], (0.0, 10.0), (1.0, 21.0), options=only_single),
        ]
    )
    lines = shapes(schedule_figure(read_study(study)))
    assert lines["makespan"] == pytest.approx([21.0])
    assert lines["planned makespan"] == pytest.approx([10.0])
    assert lines["lower bound"] == pytest.approx([20.0])  # trial 1's options rescaled by what it really took


def test_recorded_pool_is_used_over_the_inferred_one(study: optuna.Study) -> None:
    trial = saturn_trial(9, TrialState.COMPLETE, "single", [0], (0.0, 1.0), (0.0, 1.0))
    trial.system_attrs["saturn:pool"] = [f"cpu:{i}" for i in range(6)]
    study.add_trial(trial)
    (record,) = read_study(study)
    assert len(record.pool) == 6 and not record.pool_inferred
    assert summarize(record).utilisation == pytest.approx((11.5 + 2 * 6.6 + 1.8 + 0.4 + 1.0) / (6 * 12.5))


def test_later_sweeps_are_drawn_at_their_offset() -> None:
    study = make_study(
        [
            saturn_trial(0, TrialState.COMPLETE, "single", [0], (0.0, 10.0), (0.0, 10.0)),
            saturn_trial(1, TrialState.COMPLETE, "single", [0], (0.0, 10.0), (0.0, 5.0), started=T0 + 100.0),
        ]
    )
    fig = schedule_figure(read_study(study))
    assert bars(fig, "COMPLETE") == [("cpu:0", 0.0, 10.0), ("cpu:0", 100.0, 5.0)]
    assert sorted(shapes(fig)["makespan"]) == pytest.approx([10.0, 105.0])


# -- summary and note -------------------------------------------------------------------------------------------------
def test_summary_counts_states_strategies_and_utilisation(study: optuna.Study) -> None:
    (record,) = read_study(study)
    assert record.pool == ("cpu:0", "cpu:1", "cpu:2", "cpu:3") and record.pool_inferred
    s = summarize(record)
    assert s.states == {"COMPLETE": 2, "PRUNED": 1, "FAIL": 1}
    assert s.strategies == {"single ×1": 3, "ddp ×2": 1}
    assert s.makespan == pytest.approx(12.5) and s.planned_makespan == pytest.approx(20.0)
    busy = 11.5 + 2 * 6.6 + 1.8 + 0.4
    assert s.utilisation == pytest.approx(busy / (4 * 12.5))
    assert 0 < s.lower_bound <= s.makespan
    text = format_summary([record])
    assert "COMPLETE 2, PRUNED 1, FAIL 1" in text and "actual 12.5 s" in text and "planned 20.0 s" in text


def test_plan_note_lists_every_trial(study: optuna.Study) -> None:
    note = plan_note(read_study(study))
    assert "| 1 | COMPLETE | ddp | cpu:1, cpu:3 | 0.0–6.0 | 0.4–7.0 |" in note
    assert sum(line.startswith("| ") and line[2].isdigit() for line in note.splitlines()) == 4
    assert "lower bound" in note
    # why a trial failed, where optuna-dashboard shows it (a record is no user attribute): its first line
    assert "- **Trial 3 failed**: rank 0: ValueError: trial 3 went wrong\n" in note + "\n" and "Traceback" not in note


def test_a_study_an_earlier_version_recorded_in_user_attributes_is_still_read(study: optuna.Study) -> None:
    """Records a study got before they moved to the system attributes (its user attributes) read the same."""
    moved = make_study(
        [
            optuna.trial.create_trial(
                state=t.state,
                values=t.values,
                params=t.params,
                distributions=t.distributions,
                user_attrs={k: v for k, v in t.system_attrs.items() if k.startswith("saturn:")},
            )
            for t in study.trials
        ]
    )
    assert plan_note(read_study(moved)) == plan_note(read_study(study))


# -- dashboard publisher ----------------------------------------------------------------------------------------------
def graph_json(study: optuna.Study) -> str:
    attrs = study._storage.get_study_system_attrs(study._study_id)
    prefix = f"dashboard:plot_data:{GRAPH_OBJECT_ID}:"
    return "".join(
        attrs[k] for k in sorted((k for k in attrs if k.startswith(prefix)), key=lambda k: int(k.rsplit(":", 1)[1]))
    )


def test_publish_saves_the_chart_and_note(study: optuna.Study) -> None:
    from optuna_dashboard import get_note

    publish(study)
    assert "Saturn schedule" in graph_json(study) and "cpu:3" in graph_json(study)
    assert "| 2 | PRUNED | single | cpu:1 |" in get_note(study)


def test_publisher_draws_waiting_and_running_trials_and_throttles() -> None:
    clock = [0.0]
    publisher = DashboardPublisher(min_interval=5.0, background=False, clock=lambda: clock[0])
    study = optuna.create_study()
    trials = [study.ask() for _ in range(2)]
    for trial in trials:
        trial.set_user_attr("saturn:options", OPTIONS)
    started = time.time()
    publisher.on_sweep_start(study, ["cpu:0", "cpu:1"], started)
    plan = Plan(
        (
            Assignment("0", Option("single", 1, 10.0), 0, (0,), 0.0, 10.0),
            Assignment("1", Option("ddp", 2, 6.0), 0, (0, 1), 10.0, 16.0),
        )
    )
    publisher.on_plan(study, plan, [0, 1], 0.0)
    assert publisher.published == 1
    (record,) = publisher.records(study)
    assert record.pool == ("cpu:0", "cpu:1") and not record.pool_inferred
    assert [(r.number, r.state, r.devices) for r in record.runs] == [
        (0, "WAITING", ("cpu:0",)),
        (1, "WAITING", ("cpu:0", "cpu:1")),
    ]
    assert record.runs[0].options[0] == Option("single", 1, 10.0)  # read from the stored trial

    clock[0] = 1.0  # inside the interval: remembered, not written
    publisher.on_trial_start(study, TrialStart(0, "single", ("cpu:0",), 0.0, 10.0, 0.2))
    assert publisher.published == 1
    clock[0] = 6.0  # the next event after the interval writes it
    publisher.on_trial_progress(study, TrialProgress(0, 1, 10, 0.5))
    assert publisher.published == 2
    fig = schedule_figure(publisher.records(study))
    assert bars(fig, "RUNNING")[0][:2] == ("cpu:0", 0.2)
    assert "RUNNING" in graph_json(study)

    clock[0] = 7.0
    frozen = study.tell(trials[0], 1.0)
    publisher.on_trial_end(study, frozen, 8.0)
    assert publisher.published == 2
    publisher.on_sweep_end(study, 9.0, False)  # always written at the end
    assert publisher.published == 3


def test_the_publisher_never_blocks_the_sweep_and_charts_only_its_last_trials(tmp_path, monkeypatch) -> None:
    """A publish of a long study took 1.6 s in the loop's thread, every 5 s (reliability review, finding 3). The
    events now return while a publish is under way, which runs on a storage handle of its own and charts the
    last ``max_trials`` trials of this sweep only."""
    from optuna_saturn.report import dashboard

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    release, calls = threading.Event(), []

    def slow_publish(target, records, *, note):
        calls.append((target, records))
        release.wait(timeout=60)

    monkeypatch.setattr(dashboard, "publish", slow_publish)
    publisher = DashboardPublisher(min_interval=0.0, max_trials=5)
    publisher.on_sweep_start(study, ["cpu:0"], time.time())

    def events() -> None:
        for _ in range(20):
            trial = study.ask()
            trial.set_user_attr("saturn:sweep_started_at", 0.0)
            publisher.on_trial_end(study, study.tell(trial, 1.0), 1.0)

    sweep = threading.Thread(target=events)
    sweep.start()
    sweep.join(timeout=30)
    blocked = sweep.is_alive()
    release.set()
    sweep.join()
    assert not blocked, "the sweep's events waited for a publish"
    assert calls and calls[0][0]._storage is not study._storage  # a handle of its own
    publisher.on_sweep_end(study, 2.0, False)
    (record,) = calls[-1][1]
    assert [run.number for run in record.runs] == [15, 16, 17, 18, 19]


# -- export -----------------------------------------------------------------------------------------------------------
def need_chromium() -> None:
    from optuna_saturn.report.export import find_chromium

    require(find_chromium() is not None, "Chromium")


def test_html_is_self_contained(study: optuna.Study, tmp_path) -> None:
    path = write_html(schedule_figure(read_study(study)), tmp_path / "chart.html")
    html = path.read_text()
    assert '<script src="http' not in html and "Plotly.newPlot" in html and "cpu:3" in html


@pytest.mark.parametrize("exporter", ["kaleido", "chromium"])
def test_png_export(study: optuna.Study, tmp_path, monkeypatch, exporter: str) -> None:
    need_chromium()
    if exporter == "chromium":
        monkeypatch.setitem(sys.modules, "kaleido", None)  # as if kaleido were not installed
    else:
        require(importlib.util.find_spec("kaleido") is not None, "kaleido")
    path = tmp_path / "chart.png"
    assert write_png(schedule_figure(read_study(study)), path, width=900) == exporter
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5_000


def test_a_kaleido_that_hangs_is_killed_and_chromium_writes_the_png(study: optuna.Study, tmp_path, monkeypatch):
    """Kaleido's browser once hung a CI run for good inside ``write_image``: it now runs in a process group of its
    own, killed at its time limit (here 0.05 s, before it can start), and the Chromium screenshot takes over."""
    need_chromium()
    require(importlib.util.find_spec("kaleido") is not None, "kaleido")
    from optuna_saturn.report import export

    monkeypatch.setattr(export, "KALEIDO_SECONDS", 0.05)
    path = tmp_path / "chart.png"
    assert write_png(schedule_figure(read_study(study)), path, width=900) == "chromium"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- progress ---------------------------------------------------------------------------------------------------------
def tracker_with_two_trials() -> SweepTracker:
    tracker = SweepTracker()
    tracker.sweep_start(["cpu:0", "cpu:1"], time.time())
    tracker.plan(
        Plan(
            (
                Assignment("0", Option("single", 1, 10.0), 0, (0,), 0.0, 10.0),
                Assignment("1", Option("single", 1, 10.0), 0, (0,), 10.0, 20.0),
            )
        ),
        0.0,
    )
    return tracker


def test_eta_comes_from_step_rates_then_from_the_plan() -> None:
    tracker = tracker_with_two_trials()
    assert tracker.sweep_remaining(0.0) == pytest.approx(20.0)
    tracker.trial_start(TrialStart(0, "single", ("cpu:0",), 0.0, 10.0, 0.0))
    tracker.trial_progress(TrialProgress(0, 10, 100, 0.15))  # 90 steps of 0.15 s left: 13.5 s, 3.5 s late
    assert tracker.trials[0].remaining(1.5) == pytest.approx(13.5)
    assert tracker.sweep_remaining(1.5) == pytest.approx(13.5 + 10.0)  # trial 1 waits for it, then runs 10 s
    assert format_duration(75.2) == "1:15" and format_duration(3700) == "1:01:40" and format_duration(None) == "-"


def test_plain_progress_writes_lines() -> None:
    stream = io.StringIO()
    progress = PlainProgress(stream=stream, interval=0.0)
    study = optuna.create_study(study_name="p")
    trial = study.ask()
    progress.on_sweep_start(study, ["cpu:0"], time.time())
    progress.on_plan(study, Plan((Assignment("0", Option("single", 1, 10.0), 0, (0,), 0.0, 10.0),)), [0], 0.0)
    progress.on_trial_start(study, TrialStart(0, "single", ("cpu:0",), 0.0, 10.0, 0.0))
    progress.on_trial_progress(study, TrialProgress(0, 5, 10, 0.1))
    progress.on_trial_end(study, study.tell(trial, 0.25), 1.0)
    progress.on_sweep_end(study, 1.0, False)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 6 and all(line.startswith("[saturn ") for line in lines)
    assert "trial 0 started: single on cpu:0" in lines[2] and "step 5/10" in lines[3]
    assert "trial 0 COMPLETE" in lines[4] and "value 0.25" in lines[4] and "COMPLETE 1" in lines[5]


def test_rich_progress_renders_a_table() -> None:
    console = Console(file=io.StringIO(), width=140, record=True)
    progress = RichProgress(console=console)
    progress.tracker = tracker_with_two_trials()
    progress.tracker.trial_start(TrialStart(0, "single", ("cpu:0",), 0.0, 10.0, 0.0))
    progress.tracker.trial_progress(TrialProgress(0, 3, 10, 0.5))
    console.print(progress.render())
    text = console.export_text()
    assert "RUNNING" in text and "WAITING" in text and "3/10" in text and "the trials planned so far end in" in text


def test_rich_progress_off_a_terminal_leaves_the_log_handlers_writing() -> None:
    # off a terminal rich redirects neither stream, so there is no stream to swap: the handlers keep theirs
    console = Console(file=io.StringIO(), width=140)
    handler = logging.StreamHandler(sys.stderr)
    logging.getLogger("optuna").addHandler(handler)
    try:
        progress = RichProgress(console=console)
        study = optuna.create_study()
        progress.on_sweep_start(study, ["cpu:0"], time.time())
        progress.on_sweep_end(study, 1.0, False)
        assert handler.stream is sys.stderr
    finally:
        logging.getLogger("optuna").removeHandler(handler)


def test_make_progress_modes() -> None:
    assert isinstance(make_progress("quiet"), QuietProgress)
    assert isinstance(make_progress("auto", stream=io.StringIO()), PlainProgress)  # not a terminal
    assert isinstance(make_progress("rich", stream=io.StringIO()), RichProgress)
    with pytest.raises(ValueError, match="progress mode"):
        make_progress("loud")  # type: ignore[arg-type]  # an unknown mode on purpose: its error is tested
