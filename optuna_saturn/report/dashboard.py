"""Put the schedule chart and a plan note on the study, where optuna-dashboard shows them, and keep them current.

Why through the study: optuna-dashboard reads only the storage. ``save_plotly_graph_object`` with a fixed id
overwrites one chart in place (it appears on the study's page), and ``save_note`` versions the study note, so a
sweep of hours can be watched live and the final picture stays with the study.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence

import optuna

from optuna_saturn.events import SweepListener, TrialProgress, TrialStart
from optuna_saturn.planner import Plan
from optuna_saturn.report.chart import schedule_figure
from optuna_saturn.report.schedule import WAITING, RecordedRun, SweepRecord, read_study, read_sweeps, run_from_trial
from optuna_saturn.report.summary import plan_note
from optuna_saturn.study.handles import close_handle, own_handle

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
    """Re-publishes the chart and note of this sweep as it goes: on plans, trial starts and ends, and at the end.

    Why a thread of its own: a publish writes the whole chart to the storage (optuna-dashboard keeps it in
    2 KB pieces, one write each), which on a long sweep takes seconds. The sweep's events only note what changed,
    under a small lock, and return; the publisher's thread writes through a storage handle of its own, at most
    every ``min_interval`` seconds, or ten times as long as its last publish took, whichever is longer. While
    trials run it also redraws every ``refresh_interval`` seconds, so that running bars grow. The last
    ``max_trials`` trials that ended are charted (this sweep's only: a study of 20,000 trials costs what a study
    of ``max_trials`` does), with the trials waiting and running. At the sweep's end the final chart is written.

    A failed write is logged once and tried again at the next update: a busy database must not cost the sweep
    its chart. ``background=False`` publishes from the caller's thread instead (a deterministic test, a script).
    """

    def __init__(
        self,
        *,
        min_interval: float = 5.0,
        refresh_interval: float = 30.0,
        note: bool = True,
        max_trials: int = 500,
        background: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        _dashboard_api()  # fail now, not at the first plan, when optuna-dashboard is missing
        if max_trials < 1:
            raise ValueError(f"max_trials must be at least 1, got {max_trials}.")
        self.min_interval = min_interval
        self.refresh_interval = refresh_interval
        self.note = note
        self.max_trials = max_trials
        self.background = background
        self._clock = clock
        self._changes = threading.Condition()  # guards everything below that the events write
        self._last: float | None = None
        self._dirty = False
        self._stopping = False
        self._warned = False
        self._pool: tuple[str, ...] = ()
        self._started_at: float | None = None
        self._live: dict[int, RecordedRun] = {}
        self._ended: collections.OrderedDict[int, RecordedRun] = collections.OrderedDict()
        self._stored: dict[int, RecordedRun] = {}  # options and params of the live trials, read once each
        self._thread: threading.Thread | None = None
        self._target: optuna.Study | None = None  # the study, through the publisher's own storage handle
        self.cost = 0.0  # how long the last publish took, in seconds
        self.published = 0  # how many times the chart was written (for tests and curious users)

    # -- events (the sweep's thread: note the change, return) -------------------------------------------------------
    def on_sweep_start(self, study: optuna.Study, devices: Sequence[str], started_at: float) -> None:
        with self._changes:
            self._pool, self._started_at = tuple(devices), started_at
            self._live, self._ended, self._stored, self._stopping = {}, collections.OrderedDict(), {}, False
        if self.background:
            self._target = optuna.load_study(study_name=study.study_name, storage=own_handle(study._storage))
            self._thread = threading.Thread(target=self._publish_when_due, name="saturn-dashboard", daemon=True)
            self._thread.start()

    def on_plan(self, study: optuna.Study, plan: Plan, trial_numbers: Sequence[int], now: float) -> None:
        with self._changes:
            for a in plan.assignments:
                number = int(a.job)
                self._live[number] = RecordedRun(
                    number=number,
                    state=WAITING,
                    strategy=a.option.strategy,
                    devices=tuple(self._label(i) for i in a.devices),
                    planned_start=now + a.start,
                    planned_end=now + a.end,
                )
            self._changed()
        self._maybe_publish_here(study)

    def on_trial_start(self, study: optuna.Study, start: TrialStart) -> None:
        with self._changes:
            self._live[start.number] = RecordedRun(
                number=start.number,
                state="RUNNING",
                strategy=start.strategy,
                devices=tuple(start.devices),
                planned_start=start.planned_start,
                planned_end=start.planned_end,
                actual_start=start.start,
            )
            self._changed()
        self._maybe_publish_here(study)

    def on_trial_progress(self, study: optuna.Study, progress: TrialProgress) -> None:
        self._maybe_publish_here(study)  # (the thread redraws running bars on its own)

    def on_trial_end(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, now: float) -> None:
        with self._changes:
            self._live.pop(trial.number, None)
            self._stored.pop(trial.number, None)
            self._ended[trial.number] = run_from_trial(trial)
            while len(self._ended) > self.max_trials:
                self._ended.popitem(last=False)
            self._changed()
        self._maybe_publish_here(study)

    def on_sweep_end(self, study: optuna.Study, now: float, interrupted: bool) -> None:
        with self._changes:
            self._live.clear()
            self._stopping = True
            self._changes.notify_all()
        if self._thread is not None:
            self._thread.join()  # (it finishes the publish it is in, if any)
            self._thread = None
        self._publish(self._target or study)  # the final picture, always
        if self._target is not None:
            close_handle(self._target._storage, study._storage)
        self._target = None

    # -- publishing -------------------------------------------------------------------------------------------------
    def records(self, study: optuna.Study) -> list[SweepRecord]:
        """This sweep's record: the trials that ended (the last ``max_trials``), and its waiting and running ones
        as this listener knows them, with their options and params as stored."""
        with self._changes:
            live, ended = list(self._live.values()), list(self._ended.values())
        runs = ended + [self._with_stored(study, run) for run in live]
        elapsed = time.time() - self._started_at if self._started_at is not None else 0.0
        runs = [
            dataclasses.replace(run, actual_end=max(elapsed, run.actual_start or 0.0))
            if run.state == "RUNNING"
            else run
            for run in runs
        ]
        return read_sweeps((), live=runs, live_started_at=self._started_at, pool=self._pool or None)

    def _with_stored(self, study: optuna.Study, run: RecordedRun) -> RecordedRun:
        with self._changes:
            stored = self._stored.get(run.number)
        if stored is None:
            try:
                trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, run.number)
                stored = run_from_trial(study._storage.get_trial(trial_id))
            except KeyError:  # (not in the storage yet)
                return run
            with self._changes:
                if run.number in self._live:  # (not ended meanwhile: on_trial_end forgets it)
                    self._stored[run.number] = stored
        return dataclasses.replace(run, options=stored.options, params=stored.params)

    def _changed(self) -> None:
        """(Under the lock.) Something to draw: the thread wakes."""
        self._dirty = True
        self._changes.notify_all()

    def _interval(self) -> float:
        return max(self.min_interval, 10.0 * self.cost)

    def _wait(self) -> float | None:
        """(Under the lock.) Seconds until a publish is due, 0 if it is now, None if nothing is to draw."""
        since = None if self._last is None else self._clock() - self._last
        if self._dirty:
            return 0.0 if since is None else max(0.0, self._interval() - since)
        if since is not None and any(run.state == "RUNNING" for run in self._live.values()):
            return max(0.0, max(self.refresh_interval, self._interval()) - since)
        return None

    def _maybe_publish_here(self, study: optuna.Study) -> None:
        """Without a thread of its own: publish from the event's thread when due."""
        if self.background:
            return
        with self._changes:
            due = self._wait() == 0.0
        if due:
            self._publish(study)

    def _publish_when_due(self) -> None:
        while True:
            with self._changes:
                wait = self._wait()
                while not self._stopping and wait != 0.0:
                    self._changes.wait(timeout=wait)
                    wait = self._wait()
                if self._stopping:
                    return
            assert self._target is not None
            self._publish(self._target)

    def _publish(self, study: optuna.Study) -> None:
        started = time.monotonic()
        with self._changes:
            self._dirty = False
        try:
            publish(study, self.records(study), note=self.note)
        except Exception as exc:  # a locked database, a lost connection: try again at the next event
            with self._changes:
                self._dirty = True
                self._last = self._clock()
            if not self._warned:
                _logger.warning(f"Could not publish the schedule chart to the study ({exc!r}); will retry.")
                self._warned = True
            return
        with self._changes:
            self.cost = time.monotonic() - started
            self._last = self._clock()
            self.published += 1

    def _label(self, index: int) -> str:
        return self._pool[index] if index < len(self._pool) else f"device:{index}"
