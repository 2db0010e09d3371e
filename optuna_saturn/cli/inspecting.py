"""``optuna-saturn plan``, ``simulate`` and ``report``: what a recorded sweep did, and what it would do elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import optuna
import typer

from optuna_saturn.cli.app import (
    BudgetOption,
    DeadlineOption,
    PriceOption,
    RuntimesOption,
    SolverOption,
    StorageOption,
    StudyOption,
    app,
    console,
    examples,
    fail,
    gap,
    ints,
    open_study,
)
from optuna_saturn.planner import Goal, goal_of
from optuna_saturn.study.urls import without_password


@app.command(
    epilog=examples(
        "optuna-saturn plan --storage sqlite:///s.db --study demo --devices 8",
        "optuna-saturn plan --storage sqlite:///s.db --nodes 8,8 --solver highs",
    )
)
def plan(
    storage: StorageOption,
    study: StudyOption = None,
    devices: Annotated[
        int | None,
        typer.Option(
            "--devices",
            min=1,
            help="Plan on one node with this many devices (default: the recorded sweep's pool).",
            show_default=False,
        ),
    ] = None,
    nodes: Annotated[
        str | None,
        typer.Option("--nodes", help="Plan on several nodes, devices per node, e.g. 8,8.", show_default=False),
    ] = None,
    solver: SolverOption = "auto",
    time_limit: Annotated[float, typer.Option("--time-limit", min=0.0, help="Seconds the planner may use.")] = 10.0,
    runtimes: RuntimesOption = "observed",
) -> None:
    """Re-plan a study's trials as one batch from the options they recorded, and print the plan."""
    from rich.table import Table

    from optuna_saturn.planner import lower_bound, solve

    the_study = open_study(storage, study)
    jobs, cluster = _jobs_and_cluster(the_study, runtimes, _one_cluster(devices, nodes))
    try:
        result = solve(jobs, cluster, solver=solver, time_limit=time_limit)
    except ValueError as exc:  # unknown solver, options that fit no node
        fail(str(exc))
    table = Table(
        title=f"Plan for {len(jobs)} trial(s) of {the_study.study_name!r} on nodes "
        f"{list(cluster.nodes)} ({runtimes} runtimes, solver {result.solver})",
        title_justify="left",
    )
    for column in ("trial", "strategy", "devices", "micro-batches", "node", "device ids", "start (s)", "end (s)"):
        table.add_column(column, justify="left" if column in ("strategy", "device ids") else "right")
    for a in sorted(result.assignments, key=lambda a: (a.start, a.node, a.devices)):
        table.add_row(
            a.job,
            a.option.strategy,
            str(a.option.devices),
            str(a.option.gradient_accumulation),
            str(a.node),
            ",".join(map(str, a.devices)),
            f"{a.start:.1f}",
            f"{a.end:.1f}",
        )
    console().print(table)
    bound = lower_bound(jobs, cluster)
    typer.echo(
        f"makespan {result.makespan:.1f} s, lower bound {bound:.1f} s "
        f"({gap(result.makespan, bound)} over the bound{', optimal' if result.optimal else ''})"
    )


@app.command(
    epilog=examples(
        "optuna-saturn simulate --storage sqlite:///s.db --study demo",
        "optuna-saturn simulate --storage sqlite:///s.db --study demo --devices 2,4,8",
        "optuna-saturn simulate --storage sqlite:///s.db --study demo --deadline 8h",
        "optuna-saturn simulate --storage sqlite:///s.db --study demo \\",
        "    --budget 100 --price-per-device-hour 2.5",
    )
)
def simulate(
    storage: StorageOption,
    study: StudyOption = None,
    devices: Annotated[
        str | None,
        typer.Option(
            "--devices",
            help="Device counts to compare, comma-separated, e.g. 2,4,8 (each one node). Default: the "
            "recorded sweep's.",
            show_default=False,
        ),
    ] = None,
    nodes: Annotated[
        list[str] | None,
        typer.Option(
            "--nodes",
            help="A cluster as devices per node, e.g. 8,8; may be repeated to compare clusters.",
            show_default=False,
        ),
    ] = None,
    mode: Annotated[
        str,
        typer.Option(
            "--mode",
            help="replan: the executor as it ships; static: every trial keeps its first plan's place; "
            "clairvoyant: planned with the true runtimes.",
        ),
    ] = "replan",
    solver: SolverOption = "auto",
    work_limit: Annotated[
        float,
        typer.Option(
            "--work-limit",
            min=0.0,
            help="Work the planner may use per plan, in units of planner.WorkLimit (about a second each; the sweep "
            "caps it at 0.025): not seconds, so the answer is the same on any machine.",
        ),
    ] = 2.0,
    old_time_limit: Annotated[
        float | None,
        typer.Option("--time-limit", min=0.0, hidden=True, help="Deprecated: --work-limit (work units, not seconds)."),
    ] = None,
    runtimes: RuntimesOption = "observed",
    sweep: Annotated[
        int,
        typer.Option(
            "--sweep", help="Which of the study's sweeps: 1 the first, -1 the latest (one per run or optimize call)."
        ),
    ] = -1,
    deadline: DeadlineOption = None,
    budget: BudgetOption = None,
    price_per_device_hour: PriceOption = 0.0,
) -> None:
    """What if: the study's latest sweep run again by the real scheduler, in virtual time, on other device counts
    or clusters (and on its own devices: how far the simulation is from what really happened)."""
    from rich.table import Table

    from optuna_saturn.planner import Cluster, lower_bound
    from optuna_saturn.simulation.replay import replay_of
    from optuna_saturn.simulation.simulator import MODES, run_simulation

    if old_time_limit is not None:
        typer.echo(
            "--time-limit of simulate is deprecated: it is work units, not seconds; pass --work-limit.", err=True
        )
        work_limit = old_time_limit
    if mode not in MODES:
        fail(f"--mode must be one of {', '.join(MODES)}, got {mode!r}.")
    if runtimes not in ("observed", "estimated"):
        fail(f"--runtimes must be observed or estimated, got {runtimes!r}.")
    the_study = open_study(storage, study)
    try:
        replay = replay_of(the_study, sweep=sweep - 1 if sweep > 0 else sweep, observed=runtimes == "observed")
    except ValueError as exc:
        fail(str(exc))
    if deadline is not None or budget is not None:
        counts = ints(devices, "--devices") if devices else range(1, 2 * replay.devices + 1)
        try:
            goal = goal_of(deadline, budget, price_per_device_hour)
        except ValueError as exc:
            fail(str(exc))
        _size(replay, goal, counts, mode, solver, work_limit)
        return
    clusters = [Cluster([n]) for n in ints(devices, "--devices")] if devices else []
    clusters += [Cluster(ints(spec, "--nodes")) for spec in nodes or ()]
    recorded = replay.wall_seconds
    which = "The latest sweep" if sweep == -1 else f"Sweep {sweep}"
    table = Table(
        title=f"{which} of {the_study.study_name!r}: {len(replay.jobs)} trial(s), simulated "
        f"({mode}, {runtimes} runtimes)",
        title_justify="left",
    )
    for column in ("per node", "devices", "wall clock (s)", "lower bound (s)", "gap", "vs recorded sweep"):
        table.add_column(column, justify="right", no_wrap=column == "vs recorded sweep")
    jobs = [_as_run(j) for j in replay.jobs]  # (the bound of the work the trials really did)
    for cluster in clusters or [replay.cluster()]:
        same = cluster.nodes == (replay.devices,)
        try:
            result = run_simulation(
                replay.jobs,
                cluster,
                mode=mode,
                solver=solver,
                work_limit=work_limit,
                known_ahead=replay.known_ahead,
                workers_ready=replay.workers_ready if same else replay.typical_ready,
            )
        except ValueError as exc:
            fail(f"On nodes {list(cluster.nodes)}: {exc}")
        wall, bound = result.info["wall_seconds"], lower_bound(jobs, cluster)
        table.add_row(
            ",".join(map(str, cluster.nodes)),
            str(cluster.total_devices),
            f"{wall:.1f}",
            f"{bound:.1f}",
            gap(wall, bound),
            _versus(recorded, wall, same),
        )
    console().print(table)
    if recorded:
        typer.echo(
            f"The recorded sweep took {recorded:.1f} s on {replay.devices} device(s), start-up, describing "
            "and profiling included."
        )


def _size(replay: Any, goal: Goal, counts: Any, mode: str, solver: str, work_limit: float) -> None:
    """The fewest devices that meet a deadline, or the earliest end within a budget (``simulation.sizing``)."""
    from rich.table import Table

    from optuna_saturn.simulation.sizing import answer, sizes

    rows = sizes(replay, goal, counts, mode=mode, solver=solver, work_limit=work_limit)
    table = Table(title=f"{len(replay.jobs)} trial(s) planned for the {goal.name}", title_justify="left")
    for column in ("devices", "ends (s)", "device-hours", "cost", "meets it"):
        table.add_column(column, justify="right")
    for r in rows:
        ends = f"{r.wall_seconds:.0f}" if r.wall_seconds is not None else f"refused (earliest {r.earliest_end:.0f})"
        hours = f"{r.device_hours:.2f}" if r.device_hours is not None else "-"
        cost = f"{r.cost:.2f}" if r.cost is not None else "-"
        table.add_row(str(r.devices), ends, hours, cost, "yes" if r.meets else "no")
    console().print(table)
    best = answer(rows, goal)
    if best is None:
        fail(f"No pool of {', '.join(str(r.devices) for r in rows)} device(s) meets the {goal.name}.")
    what = goal.size_question
    typer.echo(
        f"{what}: {best.devices} device(s), ending at {best.wall_seconds or 0:.0f} s, "
        f"{best.device_hours or 0:.2f} device-hours" + (f", cost {best.cost:.2f}." if best.cost is not None else ".")
    )


def _as_run(simulated: Any) -> Any:
    """A replayed trial as the planner's job, with the runtimes it would take in the simulated world (its share of
    steps, if the pruner stopped it)."""
    from optuna_saturn.planner import Job, Option

    behaviour = simulated.behaviour
    return Job(
        simulated.job.name,
        [
            Option(
                choice[0],
                choice[1],
                behaviour.startup + max(runtime - behaviour.startup, 0.0) * behaviour.prune_at,
                choice[2],
            )
            for choice, runtime in behaviour.runtimes.items()
        ],
    )


def _versus(recorded: float | None, simulated: float, same: bool) -> str:
    """The simulation against the recorded sweep: its error on the same devices, the speed-up on others."""
    if not recorded or simulated <= 0:
        return "-"
    if same:
        return f"{100 * (simulated / recorded - 1):+.1f}% (the simulator's error)"
    ratio = recorded / simulated
    return f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"


@app.command(
    epilog=examples(
        "optuna-saturn report --storage sqlite:///s.db --study demo",
        "optuna-saturn report --storage sqlite:///s.db --study demo --out report",
    )
)
def report(
    storage: StorageOption,
    study: StudyOption = None,
    out: Annotated[Path, typer.Option("--out", help="Folder for schedule.html, schedule.png and summary.txt.")] = Path(
        "saturn-report"
    ),
    png: Annotated[
        bool, typer.Option("--png/--no-png", help="Also write the chart as PNG (kaleido or Chromium).")
    ] = True,
    publish: Annotated[
        bool, typer.Option("--publish", help="Also save the chart and a plan note to the study, for optuna-dashboard.")
    ] = False,
    last_sweep: Annotated[
        bool, typer.Option("--last-sweep", help="Only the latest sweep (one `run`/optimize call) of the study.")
    ] = False,
) -> None:
    """Write the schedule chart (HTML, PNG) and a text summary of a study's sweeps."""
    from optuna_saturn.report import ExportError, format_summary, read_study, schedule_figure, write_html, write_png

    the_study = open_study(storage, study)
    sweeps = read_study(the_study)
    if last_sweep:
        sweeps = sweeps[-1:]
    states: dict[str, int] = {}
    for trial in the_study.get_trials(deepcopy=False):
        states[trial.state.name] = states.get(trial.state.name, 0) + 1
    text = (
        f"Study {the_study.study_name!r}: {sum(states.values())} trial(s): "
        + (", ".join(f"{k} {v}" for k, v in sorted(states.items())) or "none")
        + "\n\n"
        + format_summary(sweeps)
    )
    typer.echo(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.txt").write_text(text + "\n", encoding="utf-8")
    figure = schedule_figure(sweeps)
    written = [write_html(figure, out / "schedule.html"), out / "summary.txt"]
    if png:
        try:
            how = write_png(figure, out / "schedule.png")
        except ExportError as exc:
            typer.echo(f"Error: {exc} Or pass --no-png.", err=True)
            raise typer.Exit(1) from None
        written.append(out / "schedule.png")
        typer.echo(f"(PNG written with {how})")
    if publish:
        from optuna_saturn.report import publish as publish_to_study

        try:
            publish_to_study(the_study, sweeps)
        except ImportError as exc:
            fail(str(exc))
        typer.echo(f"Published the chart and note to the study: optuna-dashboard {without_password(storage)}")
    typer.echo("Wrote " + ", ".join(str(p) for p in written))


def _jobs_and_cluster(study: optuna.Study, runtimes: str, cluster: Any) -> tuple[list, Any]:
    from optuna_saturn.planner import Cluster
    from optuna_saturn.report import jobs_from_runs, read_study
    from optuna_saturn.report.schedule import run_from_trial

    if runtimes not in ("observed", "estimated"):
        fail(f"--runtimes must be observed or estimated, got {runtimes!r}.")
    runs = [run_from_trial(t) for t in study.get_trials(deepcopy=False)]
    jobs = jobs_from_runs(runs, observed=runtimes == "observed")
    if not jobs:
        fail(
            f"No trial of study {study.study_name!r} recorded planner options (saturn:options); run a sweep "
            "with `optuna-saturn run` or SaturnExecutor first."
        )
    if cluster is None:
        sweeps = read_study(study)
        pool = sweeps[-1].pool if sweeps else ()
        if not pool:
            fail("Cannot tell how many devices the sweep had; pass --devices N or --nodes 8,8.")
        cluster = Cluster([len(pool)])
    return jobs, cluster


def _one_cluster(devices: int | None, nodes: str | None) -> Any:
    from optuna_saturn.planner import Cluster

    if devices is not None and nodes is not None:
        fail("Give either --devices or --nodes, not both.")
    if nodes is not None:
        return Cluster(ints(nodes, "--nodes"))
    return Cluster([devices]) if devices is not None else None
