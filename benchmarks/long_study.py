"""A long study (issue 38): the same sweep of seeded random trials (``workloads.random_workload``) on the simulated
pool (the real loop, the real planner with solver "auto", virtual time) and a real SQLite storage, run twice: on
an empty study, then on one that already holds ``--existing`` finished trials of past sweeps. A
``DashboardPublisher(min_interval=0.0)`` (publishing as often as it can, on its own thread and storage handle)
listens to both.

The target: (1) the loop's median time per event (a round that handled an event, as ``loop_scaling.py`` measures
it) on the long study is at most 1.2x that on the empty one; (2) the publisher never blocks the loop: its event
calls (``on_plan``, ``on_trial_start``, ``on_trial_end``, ``on_trial_progress``) each return within 50 ms while
its publishes take longer; (3) optuna-saturn writes at most 4 KiB of ``saturn:`` user attributes per trial
(``len(json.dumps(value))`` summed over a trial's ``saturn:*`` keys; the keys' own bytes are shown beside).

The table also shows the longest round (a one-off read that grows with the study shows there, not in the median)
and the publisher's publishes: how many, the last one's cost (the final publish at the sweep's end) and the
longest.

The past trials are copies of a finished trial of a first small simulated sweep on the same cluster, in memory
(its params, value, system and user attributes; ``saturn:sweep_started_at`` and the dates one per past sweep of
``--trials`` trials, a day apart). The first goes in through ``study.add_trial``, the others are bulk copies of
its rows (every table that refers to the trials, through Optuna's own table definitions): a few seconds for
20,000, where ``study.add_trials`` writes every attribute in a statement of its own (about 23 ms a trial here,
nearly 8 minutes for 20,000; ``--add-trials`` takes that way, and gives the same trials). Their creation is
timed and printed.

Usage: ``python benchmarks/long_study.py [--existing 20000] [--trials 200] [--devices 64] [--seed 0] [--tick 60]
[--profile] [--add-trials]``. Quick: ``--existing 2000 --trials 50``. ``--profile``: cProfile the long study's
sweep (the loop's thread) and print the top cumulative entries; that run's timings include the profiler's cost.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import functools
import io
import json
import os
import pstats
import statistics
import tempfile
import time

import _common  # noqa: F401
import optuna
import sqlalchemy
from loop_scaling import event_rounds
from optuna.storages._rdb import models  # (the bulk copy of past trials: Optuna's own tables)
from optuna.trial import TrialState, create_trial
from workloads import markdown_table, random_workload

from optuna_saturn.planner import Cluster, Job
from optuna_saturn.report.dashboard import DashboardPublisher
from optuna_saturn.simulation.known_prices import JOB_PARAMETER, SimulatedJob
from optuna_saturn.simulation.pool import Behaviour
from optuna_saturn.simulation.simulator import run_simulation

ATTR = "saturn:"
EVENT_METHODS = ("on_plan", "on_trial_start", "on_trial_end", "on_trial_progress")
MEDIAN_RATIO = 1.2  # bound (1)
EVENT_CALL_MS = 50.0  # bound (2): the longest publisher event call
ATTR_BYTES = 4096  # bound (3)
BATCH = 1000  # past trials per add_trials call
PAST = datetime.datetime(2025, 1, 1)  # when the first past sweep started


def simulated(jobs: list[Job]) -> list[SimulatedJob]:
    """Each job runs as estimated (no noise, no pruning), 100 steps: ``simulator.simulate``'s defaults."""
    return [SimulatedJob(job, Behaviour({o.choice: o.runtime for o in job.options}, steps=100)) for job in jobs]


def enqueued(study: optuna.Study, n: int) -> optuna.Study:
    for index in range(n):
        study.enqueue_trial({JOB_PARAMETER: index})
    return study


def timed(fn, seconds: list[float]):
    """``fn``, appending the seconds each call takes to ``seconds``."""

    @functools.wraps(fn)
    def timed_fn(*args, **kwargs):
        began = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - began)

    return timed_fn


def timed_publisher() -> tuple[DashboardPublisher, list[float], list[float]]:
    """A publisher whose event calls (the loop's thread) and publishes (its own thread, and the final one at the
    sweep's end) are timed, in seconds."""
    publisher, calls, publishes = DashboardPublisher(min_interval=0.0), [], []
    for name in EVENT_METHODS:
        setattr(publisher, name, timed(getattr(publisher, name), calls))
    publisher._publish = timed(publisher._publish, publishes)
    return publisher, calls, publishes


def template_trial(cluster: Cluster, seed: int) -> optuna.trial.FrozenTrial:
    """A finished trial of a small simulated sweep on ``cluster`` (in memory): what a past sweep left. One whose
    attributes are the median size, without ``saturn:pool`` (one trial per sweep carries the pool)."""
    jobs = simulated(random_workload(2 * cluster.total_devices, seed + 1))
    study = enqueued(optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed)), len(jobs))
    run_simulation(jobs, cluster, study=study, mode="replan", solver="auto", tick=60.0, seed=seed)
    done = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if ATTR + "pool" not in t.system_attrs
    ]
    return sorted(done, key=lambda t: attr_bytes(t)[0])[len(done) // 2]


def past_trial(template: optuna.trial.FrozenTrial, i: int, n: int, per_sweep: int) -> optuna.trial.FrozenTrial:
    """The ``i``-th of ``n`` past trials like ``template``, ``per_sweep`` per past sweep (a day apart, in 2025)."""
    started = template.system_attrs.get(ATTR + "sweep_started_at", 0.0) - 86_400.0 * (n // per_sweep - i // per_sweep)
    distribution = template.distributions[JOB_PARAMETER]
    began = PAST + datetime.timedelta(days=i // per_sweep, minutes=i % per_sweep)
    trial = create_trial(
        state=TrialState.COMPLETE,
        value=template.value,
        params={JOB_PARAMETER: i % per_sweep},
        distributions={JOB_PARAMETER: type(distribution)(0, per_sweep - 1)},
        user_attrs=dict(template.user_attrs),
        system_attrs={
            **{k: v for k, v in template.system_attrs.items() if k != "fixed_params"},
            ATTR + "sweep_started_at": started,
        },
    )
    trial.datetime_start, trial.datetime_complete = began, began + datetime.timedelta(hours=1)
    return trial


def add_past_trials(
    storage: optuna.storages.RDBStorage, study_name: str, template, n: int, per_sweep: int, *, bulk: bool
) -> None:
    """``n`` past trials (:func:`past_trial`) in the study. ``bulk=False``: ``study.add_trials`` in batches of
    ``BATCH`` (Optuna writes each attribute in a statement of its own: about 1 ms each on this machine, minutes
    for 20,000 trials). ``bulk=True``: the first through ``add_trial``, then copies of its rows (every table
    that refers to the trials: attributes, params, values), with ``saturn:sweep_started_at`` and the param
    changed, inserted in batches through Optuna's own table definitions."""
    study = optuna.load_study(study_name=study_name, storage=storage)
    if not bulk or n < 2:
        for first in range(0, n, BATCH):
            study.add_trials([past_trial(template, i, n, per_sweep) for i in range(first, min(first + BATCH, n))])
        return
    study.add_trial(past_trial(template, 0, n, per_sweep))
    tables = models.BaseModel.metadata.tables
    trials = tables["trials"]
    children = [t for t in tables.values() if any(fk.column.table is trials for fk in t.foreign_keys)]
    of_study = trials.c.study_id == study._study_id
    with storage.engine.begin() as connection:
        reference = connection.execute(sqlalchemy.select(trials).where(of_study)).mappings().one()
        rows = {
            table: [
                {k: v for k, v in row.items() if k not in table.primary_key.columns}
                for row in connection.execute(
                    sqlalchemy.select(table).where(table.c.trial_id == reference["trial_id"])
                ).mappings()
            ]
            for table in children
        }
        trial_row = {k: v for k, v in reference.items() if k != "trial_id"}
        for first in range(1, n, BATCH):
            pasts = {i: past_trial(template, i, n, per_sweep) for i in range(first, min(first + BATCH, n))}
            connection.execute(
                sqlalchemy.insert(trials), [{**trial_row, **dates(p), "number": i} for i, p in pasts.items()]
            )
            ids = dict(connection.execute(sqlalchemy.select(trials.c.number, trials.c.trial_id).where(of_study)).all())
            for table, copied in rows.items():
                out = []
                for i, past in pasts.items():
                    for row in copied:
                        row = {**row, "trial_id": ids[i]}
                        if table.name == "trial_system_attributes" and row["key"] == ATTR + "sweep_started_at":
                            row["value_json"] = json.dumps(past.system_attrs[row["key"]])
                        if table.name == "trial_params" and row["param_name"] == JOB_PARAMETER:
                            row["param_value"] = float(past.params[JOB_PARAMETER])
                        out.append(row)
                if out:
                    connection.execute(sqlalchemy.insert(table), out)


def dates(trial: optuna.trial.FrozenTrial) -> dict:
    return {"datetime_start": trial.datetime_start, "datetime_complete": trial.datetime_complete}


def attr_bytes(trial: optuna.trial.FrozenTrial) -> tuple[int, int]:
    """The bytes of ``trial``'s ``saturn:`` records (system attributes): values as JSON, and keys plus values."""
    records = {k: v for k, v in trial.system_attrs.items() if k.startswith(ATTR)}
    values = sum(len(json.dumps(v)) for v in records.values())
    keys = sum(len(k) for k in records)
    return values, values + keys


def run_case(
    label: str,
    folder: str,
    existing: int,
    trials: int,
    cluster: Cluster,
    seed: int,
    tick: float,
    template: optuna.trial.FrozenTrial,
    *,
    bulk: bool,
    profile: bool,
) -> dict:
    url = f"sqlite:///{os.path.join(folder, label + '.db')}"
    optuna.create_study(study_name="long", storage=optuna.storages.RDBStorage(url))
    creation = 0.0
    if existing:
        began = time.perf_counter()
        add_past_trials(optuna.storages.RDBStorage(url), "long", template, existing, trials, bulk=bulk)
        creation = time.perf_counter() - began
        print(f"{label}: {existing} past trials created in {creation:.1f} s", flush=True)
    # the sweep opens the study as a new process would: a storage handle of its own
    study = optuna.load_study(
        study_name="long", storage=optuna.storages.RDBStorage(url), sampler=optuna.samplers.RandomSampler(seed=seed)
    )
    enqueued(study, trials)
    jobs = simulated(random_workload(trials, seed))
    publisher, calls, publishes = timed_publisher()
    profiler = cProfile.Profile() if profile else None
    with event_rounds() as rounds:
        began = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        run_simulation(
            jobs, cluster, study=study, listeners=[publisher], n_trials=trials, tick=tick, seed=seed, mode="replan"
        )
        if profiler is not None:
            profiler.disable()
        wall = time.perf_counter() - began
    new = [t for t in study.get_trials(deepcopy=False) if t.number >= existing]
    finished = sum(t.state.is_finished() for t in new)
    sizes = [attr_bytes(t) for t in new]
    rounds.sort()
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(40)
        print(out.getvalue(), flush=True)
    return {
        "label": label,
        "existing": existing,
        "creation": creation,
        "finished": finished,
        "wall": wall,
        "events": len(rounds),
        "median": statistics.median(rounds),
        "p99": rounds[int(0.99 * len(rounds))],
        "max": rounds[-1],
        "published": publisher.published,
        "longest_call": max(calls, default=0.0),
        "calls": len(calls),
        "cost": publisher.cost,
        "longest_publish": max(publishes, default=0.0),
        "bytes_median": statistics.median(v for v, _ in sizes),
        "bytes_max": max(v for v, _ in sizes),
        "keyed_max": max(k for _, k in sizes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--existing", type=int, default=20_000, help="finished trials already in the long study")
    parser.add_argument("--trials", type=int, default=200, help="trials of the sweep")
    parser.add_argument("--devices", type=int, default=64, help="devices, nodes of 8")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tick", type=float, default=60.0, help="the loop's idle wake-ups, in virtual seconds")
    parser.add_argument("--profile", action="store_true", help="cProfile the long study's sweep")
    parser.add_argument(
        "--add-trials",
        action="store_true",
        help="create the past trials with study.add_trials only (slow: minutes for 20,000) instead of bulk copies",
    )
    args = parser.parse_args()
    cluster = Cluster([8] * (args.devices // 8))
    began = time.perf_counter()
    template = template_trial(cluster, args.seed)  # (also warms the imports and the solver up)
    print(
        f"template: trial {template.number} of a {2 * args.devices}-trial sweep, {attr_bytes(template)[0]} bytes of "
        f"saturn: attributes ({time.perf_counter() - began:.1f} s)",
        flush=True,
    )
    cases = []
    with tempfile.TemporaryDirectory(prefix="saturn-long-study-") as folder:
        for label, existing in (("empty", 0), ("long", args.existing)):
            case = run_case(
                label,
                folder,
                existing,
                args.trials,
                cluster,
                args.seed,
                args.tick,
                template,
                bulk=not args.add_trials,
                profile=args.profile and existing > 0,
            )
            print(case, flush=True)
            cases.append(case)
    empty, long = cases
    ratio = long["median"] / empty["median"]
    rows = [
        [
            c["label"],
            c["existing"],
            f"{c['finished']}/{args.trials}",
            f"{c['wall']:.1f}",
            c["events"],
            f"{1e3 * c['median']:.2f}",
            f"{1e3 * c['p99']:.1f}",
            f"{1e3 * c['max']:.0f}",
            f"{ratio:.2f}" if c is long else "1.00",
            c["published"],
            f"{1e3 * c['longest_call']:.2f} ({c['calls']} calls)",
            f"{c['cost']:.3f} / {c['longest_publish']:.3f}",
            f"{c['bytes_median']:.0f} / {c['bytes_max']} ({c['keyed_max']})",
        ]
        for c in cases
    ]
    print(
        markdown_table(
            [
                "case",
                "trials already in the study",
                "finished",
                "wall (s)",
                "events",
                "loop per event, median (ms)",
                "p99 (ms)",
                "max (ms)",
                "ratio of medians",
                "publishes",
                "longest publisher event call (ms)",
                "publish cost, last / longest (s)",
                "saturn: attribute bytes per trial, median / max (max with keys)",
            ],
            rows,
        )
    )
    if long["creation"]:
        how = f"add_trials, batches of {BATCH}" if args.add_trials else "one add_trial, then bulk copies of its rows"
        print(f"\n{args.existing} past trials created in {long['creation']:.1f} s ({how}).")
    longest = max(c["longest_call"] for c in cases)
    slowest_publish = max(c["longest_publish"] for c in cases)
    biggest = max(c["bytes_max"] for c in cases)
    verdicts = [
        (f"(1) median per event, long / empty = {ratio:.2f} <= {MEDIAN_RATIO}", ratio <= MEDIAN_RATIO),
        (
            f"(2) longest publisher event call {1e3 * longest:.2f} ms < {EVENT_CALL_MS:.0f} ms, its publishes take "
            f"up to {slowest_publish:.3f} s, {sum(c['published'] for c in cases)} of them",
            1e3 * longest < EVENT_CALL_MS and slowest_publish > longest and all(c["published"] for c in cases),
        ),
        (f"(3) saturn: attributes per trial, max {biggest} bytes <= {ATTR_BYTES}", biggest <= ATTR_BYTES),
    ]
    print()
    for text, ok in verdicts:
        print(f"{'PASS' if ok else 'FAIL'} {text}")


if __name__ == "__main__":
    main()
