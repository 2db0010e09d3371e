"""The table ``optuna-saturn profile`` prints: one row per (trial, option) measured, in 80 columns.

Its rows come from the profiles a trial carries (``saturn:profiles``), which hold what a profiling run timed or
what a real run learned: a profile learned from a real run has no peak memory, and one from an option that did not
fit has no step time. Every figure may therefore be missing, and is then shown as ``-``, never a crash.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from optuna.trial import FrozenTrial

from optuna_saturn.planner._types import option_label
from optuna_saturn.study.records import record

#: The table's columns: short headers, so that the whole table fits an 80-column terminal without breaking a word.
COLUMNS = ("trial", "params", "option", "µbatch", "ms/step", "start s", "MiB", "trial s")


def profile_rows(trials: Iterable[FrozenTrial]) -> list[tuple[str, ...]]:
    """One row per profile of each trial: its number, its params, the option (``ddpx2``), the micro-batches a
    global batch is split into, the step time, the start-up, the peak memory (MiB) and the whole trial's predicted
    runtime (``no fit`` where the option did not fit)."""
    rows: list[tuple[str, ...]] = []
    for trial in trials:
        options = record(trial, "options") or []
        runtimes = {(o["strategy"], o["devices"], o.get("gradient_accumulation", 1)): o.get("runtime") for o in options}
        params = ", ".join(f"{k}={_short(v)}" for k, v in trial.params.items())
        for p in record(trial, "profiles") or []:
            accumulation = p.get("gradient_accumulation", 1)
            fits = bool(p.get("feasible"))
            runtime = runtimes.get((p["strategy"], p["devices"], accumulation))
            rows.append(
                (
                    str(trial.number),
                    params,
                    option_label(p["strategy"], p["devices"]),
                    str(accumulation),
                    _scaled(p.get("step_seconds"), 1e3) if fits else "-",
                    _scaled(p.get("startup_seconds"), 1) if fits else "-",
                    _scaled(p.get("peak_memory_bytes"), 2**-20),
                    (_scaled(runtime, 1) if fits else "no fit"),
                )
            )
    return rows


def profile_table(trials: Iterable[FrozenTrial], *, title: str) -> Any:
    """The rich table of :func:`profile_rows`: the params column folds (it may be long), no other cell is cut."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for column in COLUMNS:
        table.add_column(
            column,
            justify="left" if column in ("params", "option") else "right",
            no_wrap=column != "params",
            overflow="fold",
            min_width=len(column),
        )
    for row in profile_rows(trials):
        table.add_row(*row)
    return table


def _scaled(value: Any, factor: float) -> str:
    """``value * factor`` with three significant figures where it is small (a tiny model's step: ``0.512``), no
    more decimals than that where it is large; ``-`` where there is no value."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-"
    scaled = value * factor
    return f"{scaled:.0f}" if abs(scaled) >= 100 else f"{scaled:.1f}" if abs(scaled) >= 10 else f"{scaled:.3g}"


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
