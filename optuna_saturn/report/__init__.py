"""See the sweep: the schedule chart, its summary, and publishing both to optuna-dashboard.

``read_study`` turns a study's ``saturn:*`` user attributes into :class:`SweepRecord` objects; ``schedule_figure``
draws them (plotly), ``format_summary`` / ``plan_note`` describe them, and :class:`DashboardPublisher` keeps the
chart and note on the study up to date while a sweep runs (pass it in ``SaturnExecutor(listeners=[...])``).
"""

from optuna_saturn.report.chart import plot_schedule, schedule_figure
from optuna_saturn.report.dashboard import GRAPH_OBJECT_ID, DashboardPublisher, publish
from optuna_saturn.report.export import ExportError, write_html, write_png
from optuna_saturn.report.schedule import RecordedRun, SweepRecord, jobs_from_runs, read_study, read_sweeps
from optuna_saturn.report.summary import SweepSummary, format_summary, plan_note, summarize

__all__ = [
    "GRAPH_OBJECT_ID",
    "DashboardPublisher",
    "ExportError",
    "RecordedRun",
    "SweepRecord",
    "SweepSummary",
    "format_summary",
    "jobs_from_runs",
    "plan_note",
    "plot_schedule",
    "publish",
    "read_study",
    "read_sweeps",
    "schedule_figure",
    "summarize",
    "write_html",
    "write_png",
]
