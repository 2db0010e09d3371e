"""The schedule chart: a Gantt chart with one row per device, planned against actual, with makespan and bound.

Why not Optuna's timeline: it has one bar per trial and knows nothing of devices, strategies or the plan. Here a
trial on two devices is a bar on each of their rows; the plan is an outline behind the bar of what really
happened; the vertical lines say how far the sweep is from the best any plan could do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna
import plotly.graph_objects as go

from optuna_saturn.report.schedule import RecordedRun, SweepRecord, device_sort_key, read_study

TITLE = "Saturn schedule<br><sup>trials per device: bars ran, grey outlines planned</sup>"
STATE_COLOURS = {"COMPLETE": "#2e9e5b", "PRUNED": "#f0a030", "FAIL": "#d64545", "RUNNING": "#3b7dd8"}
PLANNED_NAME = "planned"
PROFILING_NAME = "profiling"
PROFILING_COLOUR = "#b8b8b8"
LINE_STYLES = {  # shape name -> (colour, dash, label); labels stack above the plot in this order
    "makespan": ("#222222", "solid", "makespan"),
    "planned makespan": ("#888888", "dot", "planned"),
    "lower bound": ("#7b3fbf", "dash", "lower bound"),
}
_MAX_PARAMS_IN_HOVER = 10


def schedule_figure(sweeps: Sequence[SweepRecord], *, title: str = TITLE) -> go.Figure:
    """A plotly Gantt chart of ``sweeps`` (see :func:`~optuna_saturn.report.schedule.read_sweeps`).

    The x axis is seconds since the first sweep started; later sweeps are drawn at their real offset. Each sweep
    gets vertical lines named ``makespan``, ``planned makespan`` and ``lower bound`` (``layout.shapes[i].name``).
    """
    origin = min((s.started_at for s in sweeps), default=0.0)
    rows = sorted(
        {d for s in sweeps for r in s.runs for d in (*r.devices, *(d for p in r.profiling for d in p.devices))},
        key=device_sort_key,
    )
    fig = go.Figure()
    profiling = [(s.started_at - origin, r) for s in sweeps for r in s.runs if r.profiling]
    if profiling:
        fig.add_trace(_profiling_bars(profiling))
    planned = [(s.started_at - origin, r) for s in sweeps for r in s.runs if r.planned_runtime is not None]
    fig.add_trace(_bars(PLANNED_NAME, planned, start="planned", outline=True))
    for state, colour in STATE_COLOURS.items():
        ran = [(s.started_at - origin, r) for s in sweeps for r in s.runs if r.ran and r.state == state]
        if ran:
            fig.add_trace(_bars(state, ran, start="actual", colour=colour))
    for index, sweep in enumerate(sweeps):
        _mark_sweep(
            fig, sweep, offset=sweep.started_at - origin, label=f"sweep {index + 1}: " if len(sweeps) > 1 else ""
        )
    fig.update_layout(
        title={
            "text": title,
            "x": 0.01,
            "y": 0.97,
            "yanchor": "top",
            "yref": "container",
            "pad": {"t": 14},  # (optuna-dashboard's card cuts the top few pixels of its plots)
            "font": {"size": 15},
        },
        barmode="overlay",
        bargap=0.25,
        xaxis={"title": "seconds since the sweep started", "rangemode": "tozero", "zeroline": True},
        yaxis={
            "title": None,
            "categoryorder": "array",
            "categoryarray": rows,
            "autorange": "reversed",
            "type": "category",
        },
        legend={"orientation": "h", "yanchor": "top", "y": -0.22, "xanchor": "left", "x": 0.0},
        margin={"l": 70, "r": 60, "t": 120, "b": 90},
        height=max(360, 200 + 48 * len(rows)),
        plot_bgcolor="white",
        hoverlabel={"align": "left"},
        uniformtext={"minsize": 9, "mode": "hide"},  # a label that does not fit its bar is hidden, not shrunk
    )
    fig.update_xaxes(showgrid=True, gridcolor="#e6e6e6")
    return fig


def plot_schedule(study: optuna.Study, *, last_sweep_only: bool = False) -> go.Figure:
    """The schedule chart of every sweep recorded in ``study`` (or of its latest sweep only)."""
    sweeps = read_study(study)
    return schedule_figure(sweeps[-1:] if last_sweep_only else sweeps)


def _bars(
    name: str, runs: Sequence[tuple[float, RecordedRun]], *, start: str, outline: bool = False, colour: str = "#999"
) -> go.Bar:
    """One horizontal bar per (trial, device): ``start`` picks the planned or the actual times."""
    ys, bases, lengths, texts, hovers = [], [], [], [], []
    for offset, run in runs:
        begin = run.planned_start if start == "planned" else run.actual_start
        length = run.planned_runtime if start == "planned" else run.actual_runtime
        if begin is None or length is None:
            continue
        for device in run.devices:
            ys.append(device)
            bases.append(offset + begin)
            lengths.append(max(length, 0.0))
            if outline:  # (only a trial that has not run yet: one that ran is named by its own bar)
                texts.append("" if run.actual_start is not None else f"#{run.number} planned")
            else:
                texts.append(f"#{run.number} {run.strategy or ''}".strip())
            hovers.append(_hover(run))
    marker: dict[str, Any] = (
        {"color": "rgba(0,0,0,0)", "line": {"color": "#8a8a8a", "width": 1.2}}
        if outline
        else {"color": colour, "line": {"color": "white", "width": 0.5}}
    )
    return go.Bar(
        name=name,
        y=ys,
        x=lengths,
        base=bases,
        orientation="h",
        marker=marker,
        width=0.8 if outline else 0.5,
        text=texts,
        # inside, hidden where it does not fit (the layout's uniformtext): outside its bar, a label ran into the
        # next bar's on a busy device
        textposition="inside",
        insidetextanchor="start",
        textangle=0,
        textfont={"color": "#6a6a6a", "size": 10} if outline else {"color": "white", "size": 11},
        hovertext=hovers,
        hoverinfo="text",
        cliponaxis=False,
    )


def _profiling_bars(runs: Sequence[tuple[float, RecordedRun]]) -> go.Bar:
    """Grey bars for the devices' time spent in short profiling launches, before the trials were planned."""
    ys, bases, lengths, texts, hovers = [], [], [], [], []
    for offset, run in runs:
        for p in run.profiling:
            for device in p.devices:
                ys.append(device)
                bases.append(offset + p.start)
                lengths.append(max(p.end - p.start, 0.0))
                texts.append(f"profile #{run.number}")
                hovers.append(f"profiling for trial {run.number}: {p.option}<br>{p.start:.1f} s to {p.end:.1f} s")
    return go.Bar(
        name=PROFILING_NAME,
        y=ys,
        x=lengths,
        base=bases,
        orientation="h",
        width=0.5,
        marker={"color": PROFILING_COLOUR, "line": {"color": "white", "width": 0.5}},
        text=texts,
        textposition="inside",
        insidetextanchor="start",
        textangle=0,
        textfont={"color": "#333333", "size": 10},
        hovertext=hovers,
        hoverinfo="text",
        cliponaxis=False,
    )


def _hover(run: RecordedRun) -> str:
    lines = [f"<b>Trial #{run.number}</b> ({run.state})"]
    if run.strategy:
        lines.append(f"strategy {run.strategy} on {', '.join(run.devices)}")
    if run.actual_start is not None:
        end = f"{run.actual_end:.1f}" if run.actual_end is not None else "…"
        took = f" ({run.actual_runtime:.1f} s)" if run.actual_runtime is not None else ""
        lines.append(f"actual {run.actual_start:.1f}–{end} s{took}")
    if run.planned_start is not None and run.planned_end is not None:
        lines.append(f"planned {run.planned_start:.1f}–{run.planned_end:.1f} s ({run.planned_runtime:.1f} s)")
    if run.values is not None:
        lines.append("value " + ", ".join(f"{v:.6g}" for v in run.values))
    if run.fail_reason:
        lines.append("reason: " + _short(run.fail_reason, 120))
    params = list(run.params.items())
    lines += [f"{k} = {_short(_fmt(v), 40)}" for k, v in params[:_MAX_PARAMS_IN_HOVER]]
    if len(params) > _MAX_PARAMS_IN_HOVER:
        lines.append(f"… and {len(params) - _MAX_PARAMS_IN_HOVER} more params")
    return "<br>".join(lines)


def _mark_sweep(fig: go.Figure, sweep: SweepRecord, *, offset: float, label: str) -> None:
    marks = {
        "makespan": sweep.makespan if any(r.ran for r in sweep.runs) else None,
        "planned makespan": sweep.planned_makespan or None,
        "lower bound": sweep.lower_bound(),
    }
    for level, (name, value) in enumerate(marks.items()):
        if value is None:
            continue
        colour, dash, text = LINE_STYLES[name]
        x = offset + value
        fig.add_shape(
            type="line",
            name=name,
            x0=x,
            x1=x,
            y0=0,
            y1=1,
            yref="paper",
            line={"color": colour, "dash": dash, "width": 2},
        )
        fig.add_annotation(
            x=x,
            y=1.0,
            yref="paper",
            yanchor="bottom",
            yshift=2 + 16 * level,
            showarrow=False,
            text=f"{label}{text} {value:.1f} s",
            font={"color": colour, "size": 11},
            bgcolor="rgba(255,255,255,0.85)",
        )


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


__all__ = ["LINE_STYLES", "PLANNED_NAME", "STATE_COLOURS", "TITLE", "plot_schedule", "schedule_figure"]
