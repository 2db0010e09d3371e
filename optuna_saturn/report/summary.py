"""Numbers that say how a sweep went, as plain text (terminal) and as a markdown note (optuna-dashboard).

Why both: the chart shows the shape of a sweep, but "how far from the best possible, and how busy were the
devices" is a sentence, and it should read the same in a terminal and in the dashboard.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from optuna_saturn.planner._types import option_label
from optuna_saturn.report.schedule import SweepRecord

_NOTE_MAX_ROWS = 100
_STATE_ORDER = ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")


@dataclass(frozen=True)
class SweepSummary:
    """Summary numbers of one sweep. Times in seconds since the sweep started; ``None`` where unknown."""

    started_at: float
    trials: int
    states: dict[str, int]
    strategies: dict[str, int]  # "ddp x2" -> number of trials
    pool: tuple[str, ...]
    pool_inferred: bool
    makespan: float | None
    planned_makespan: float | None
    lower_bound: float | None
    utilisation: float | None
    profiling_share: float | None = None


def summarize(record: SweepRecord) -> SweepSummary:
    """Count states and strategies and compute the makespans, the bound and the utilisation of one sweep."""
    states = Counter(r.state for r in record.runs)
    strategies = Counter(option_label(r.strategy, len(r.devices)) for r in record.runs if r.strategy and r.devices)
    return SweepSummary(
        started_at=record.started_at,
        trials=len(record.runs),
        states={s: states[s] for s in sorted(states, key=_state_rank)},
        strategies=dict(strategies.most_common()),
        pool=record.pool,
        pool_inferred=record.pool_inferred,
        makespan=record.makespan if any(r.ran for r in record.runs) else None,
        planned_makespan=record.planned_makespan or None,
        lower_bound=record.lower_bound(),
        utilisation=record.utilisation(),
        profiling_share=record.profiling_share(),
    )


def format_summary(records: Sequence[SweepRecord]) -> str:
    """A few plain-text lines per sweep (for terminals and logs)."""
    if not records:
        return "No optuna-saturn sweep recorded in this study (no trial has saturn:* user attributes)."
    blocks = []
    for index, record in enumerate(records, 1):
        s = summarize(record)
        pool = f"{len(s.pool)} device(s)" + (" (inferred from the devices used)" if s.pool_inferred else "")
        blocks.append(
            "\n".join(
                [
                    f"Sweep {index}, started {_clock(s.started_at)}: {s.trials} trial(s) on {pool}",
                    f"  states:      {_counts(s.states)}",
                    f"  strategies:  {_counts(s.strategies) or '-'}",
                    f"  makespan:    {makespan_sentence(s)}",
                    f"  utilisation: {_percent(s.utilisation)} of the pool's device-time over the makespan ran trials, "
                    f"{_percent(s.profiling_share)} profiled them",
                ]
            )
        )
    return "\n\n".join(blocks)


def makespan_sentence(s: SweepSummary) -> str:
    """ "actual 52.2 s, planned 55.0 s, lower bound 40.1 s (actual 1.30x the bound)"."""
    parts = [
        f"actual {_seconds(s.makespan)}",
        f"planned {_seconds(s.planned_makespan)}",
        f"lower bound {_seconds(s.lower_bound)}",
    ]
    if s.makespan and s.lower_bound:
        parts[-1] += f" (actual {s.makespan / s.lower_bound:.2f}x the bound)"
    return ", ".join(parts)


def plan_note(records: Sequence[SweepRecord]) -> str:
    """A markdown note for optuna-dashboard: per trial, strategy and devices, plan and actual; the makespans."""
    lines = ["# Saturn schedule", ""]
    if not records:
        return "\n".join([*lines, "No optuna-saturn sweep recorded yet."])
    for index, record in enumerate(records, 1):
        s = summarize(record)
        lines += [
            f"## Sweep {index} (started {_clock(s.started_at)}, pool of {len(s.pool)} device(s)"
            + (", inferred" if s.pool_inferred else "")
            + ")",
            "",
            f"**Makespan**: {makespan_sentence(s)}. **Utilisation**: {_percent(s.utilisation)} trials, "
            f"{_percent(s.profiling_share)} profiling. "
            f"**Trials**: {_counts(s.states)}.",
            "",
            "| trial | state | strategy | devices | planned (s) | actual (s) |",
            "|---:|---|---|---|---|---|",
        ]
        runs = record.runs[-_NOTE_MAX_ROWS:]
        if len(record.runs) > len(runs):
            lines.insert(len(lines) - 2, f"Only the last {_NOTE_MAX_ROWS} of {len(record.runs)} trials are listed.")
        for r in runs:
            lines.append(
                f"| {r.number} | {r.state} | {r.strategy or '-'} | {', '.join(r.devices) or '-'} | "
                f"{_span(r.planned_start, r.planned_end)} | {_span(r.actual_start, r.actual_end)} |"
            )
        lines.append("")
        # (why each trial failed: the sweep's records are not user attributes, which the dashboard shows)
        failed = [r for r in runs if r.state == "FAIL" and r.fail_reason]
        lines += [f"- **Trial {r.number} failed**: {_first_line(r.fail_reason)}" for r in failed]
        lines += [""] if failed else []
    lines.append(
        "_Times are seconds since each sweep started. The lower bound holds for any plan of these trials "
        "on this pool; it uses the options the planner chose from (`saturn:options`), each trial's "
        "rescaled by its actual / planned runtime._"
    )
    return "\n".join(lines)


def _first_line(text: str | None, limit: int = 300) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _state_rank(state: str) -> int:
    return _STATE_ORDER.index(state) if state in _STATE_ORDER else len(_STATE_ORDER)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _span(start: float | None, end: float | None) -> str:
    if start is None:
        return "-"
    return f"{start:.1f}–{end:.1f}" if end is not None else f"{start:.1f}–…"


def _clock(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))
