"""Put the schedule chart and a plan note on the study, where optuna-dashboard shows them, and keep them current.

Why through the study: optuna-dashboard reads only the storage. ``save_plotly_graph_object`` with a fixed id
overwrites one chart in place (it appears on the study's page), and ``save_note`` versions the study note, so a
sweep of hours can be watched live and the final picture stays with the study.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import optuna

from optuna_saturn.events import SweepListener, TrialProgress, TrialStart
from optuna_saturn.planner import Plan
from optuna_saturn.report.chart import schedule_figure
from optuna_saturn.report.schedule import WAITING, SweepRecord, TrialRun, read_study, read_sweeps, run_from_trial
from optuna_saturn.report.summary import plan_note

GRAPH_OBJECT_ID = "saturn-schedule"  # the chart's id: the dashboard renders it as #user-defined-plot:saturn-schedule
_logger = optuna.logging.get_logger("optuna.saturn")


def publish(
    study: optuna.Study,
    sweeps: Sequence[SweepRecord] | None = None,
    *,
    note: bool = True,
    graph_object_id: str = GRAPH_OBJECT_ID,
) -> None:
    """Save the schedule chart (and the plan note) of ``sweeps`` (default: all of the study's) to ``study``."""
    save_note, save_plotly_graph_object = _dashboard_api()
    records = read_study(study) if sweeps is None else list(sweeps)
    figure = schedule_figure(records).update_layout(height=None)  # fill the dashboard's fixed-height card
    save_plotly_graph_object(study, figure, graph_object_id=graph_object_id)
    if note:
        save_note(study, plan_note(records))


def _dashboard_api() -> tuple[Callable, Callable]:
    try:
        from optuna_dashboard import save_note, save_plotly_graph_object
    except ImportError as exc:  # an optional extra
        raise ImportError(
            "Publishing to optuna-dashboard needs it installed: pip install optuna-dashboard plotly kaleido (the "
            "dashboard extra: pip install '.[dashboard]' from optuna-saturn's clone)."
        ) from exc
    return save_note, save_plotly_graph_object


class DashboardPublisher(SweepListener):
    """Re-publishes the chart and note as a sweep goes: on plans, trial starts and ends (throttled), and at the end.

    Publishing writes the whole chart to the storage, so it happens at most every ``min_interval`` seconds; an
    update that falls inside the interval is published by the next event after it (progress reports included),
    and always at the end of the sweep. While trials run, progress reports also redraw the chart every
    ``refresh_interval`` seconds, so that running bars grow even when no trial starts or ends.

    Trials that are planned or running are drawn from what this listener was told, since their ``saturn:*``
    attributes are only written when they end. A failed write is logged and retried at the next update: a busy
    database must not cost the sweep its chart.
    """

    def __init__(
        self,
        *,
        min_interval: float = 5.0,
        refresh_interval: float = 30.0,
        note: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        _dashboard_api()  # fail now, not at the first plan, when optuna-dashboard is missing
        self.min_interval = min_interval
        self.refresh_interval = refresh_interval
        self.note = note
        self._clock = clock
        self._last: float | None = None
        self._dirty = False
        self._warned = False
        self._pool: tuple[str, ...] = ()
        self._started_at: float | None = None
        self._live: dict[int, TrialRun] = {}
        self.published = 0  # how many times the chart was written (for tests and curious users)

    # -- events -----------------------------------------------------------------------------------------------------
    def on_sweep_start(self, study: optuna.Study, devices: Sequence[str], started_at: float) -> None:
        self._pool, self._started_at, self._live = tuple(devices), started_at, {}

    def on_plan(self, study: optuna.Study, plan: Plan, trial_numbers: Sequence[int], now: float) -> None:
        for a in plan.assignments:
            number = int(a.job)
            self._live[number] = TrialRun(
                number=number,
                state=WAITING,
                strategy=a.option.strategy,
                devices=tuple(self._label(i) for i in a.devices),
                planned_start=now + a.start,
                planned_end=now + a.end,
            )
        self._update(study)

    def on_trial_start(self, study: optuna.Study, start: TrialStart) -> None:
        self._live[start.number] = TrialRun(
            number=start.number,
            state="RUNNING",
            strategy=start.strategy,
            devices=tuple(start.devices),
            planned_start=start.planned_start,
            planned_end=start.planned_end,
            actual_start=start.start,
        )
        self._update(study)

    def on_trial_progress(self, study: optuna.Study, progress: TrialProgress) -> None:
        if self._dirty or self._last is None or self._clock() - self._last >= self.refresh_interval:
            self._update(study)

    def on_trial_end(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, now: float) -> None:
        self._live.pop(trial.number, None)
        self._update(study)

    def on_sweep_end(self, study: optuna.Study, now: float, interrupted: bool) -> None:
        self._live.clear()
        self._update(study, force=True)

    # -- publishing -------------------------------------------------------------------------------------------------
    def records(self, study: optuna.Study) -> list[SweepRecord]:
        """Every sweep of ``study``, this one with its waiting and running trials as this listener knows them."""
        trials = study.get_trials(deepcopy=False)
        stored = {t.number: t for t in trials}
        elapsed = time.time() - self._started_at if self._started_at is not None else 0.0
        live = []
        for run in self._live.values():
            if run.number in stored:  # options and params are in the storage already
                base = run_from_trial(stored[run.number])
                run = dataclasses.replace(run, options=base.options, params=base.params)
            if run.state == "RUNNING":
                run = dataclasses.replace(run, actual_end=max(elapsed, run.actual_start or 0.0))
            live.append(run)
        return read_sweeps(trials, live=live, live_started_at=self._started_at, pool=self._pool or None)

    def _update(self, study: optuna.Study, *, force: bool = False) -> None:
        now = self._clock()
        if not force and self._last is not None and now - self._last < self.min_interval:
            self._dirty = True
            return
        try:
            publish(study, self.records(study), note=self.note)
        except Exception as exc:  # a locked database, a lost connection: try again at the next event
            self._dirty = True
            if not self._warned:
                _logger.warning(f"Could not publish the schedule chart to the study ({exc!r}); will retry.")
                self._warned = True
            return
        self._last, self._dirty = now, False
        self.published += 1

    def _label(self, index: int) -> str:
        return self._pool[index] if index < len(self._pool) else f"device:{index}"
