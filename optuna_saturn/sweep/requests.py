"""The jobs the loop submits: a trial's run, or a profiling job, as the pool protocol's :class:`JobRequest`, with
the sessions their ranks talk to. Each run of a trial gets a key of its own: ``trial-N`` first, then ``trial-N.1``,
``trial-N.2`` for a trial run again or moved; its log is one per trial (later runs append to it)."""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import optuna

from optuna_saturn.clock import Clock
from optuna_saturn.planner import Option
from optuna_saturn.pools.protocol import JobRequest, Task
from optuna_saturn.pricing.prices import ProfileJob
from optuna_saturn.strategy import Strategy
from optuna_saturn.study.folders import safe
from optuna_saturn.study.trial_session import TrialSession
from optuna_saturn.training import checkpoint


class JobRequests:
    def __init__(
        self,
        *,
        run_dir: Path,
        checkpoint_root: Path,
        strategies: dict[str, Strategy],
        profile_steps: tuple[int, int],
        lock: threading.Lock,
        clock: Clock,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        """``on_stop``: a trial's objective called ``trial.study.stop()`` (as in ``study.optimize``, no trial is
        asked after it)."""
        self.run_dir = run_dir
        self._on_stop = on_stop
        self.study: optuna.Study | None = None  # what a queued trial's snapshot names as its study
        self._checkpoint_root = checkpoint_root
        self._strategies = strategies
        self._profile_steps = profile_steps
        self._lock = lock
        self._clock = clock
        self._runs = itertools.count()
        self._trial_runs: collections.Counter[int] = collections.Counter()

    def trial(
        self, trial: optuna.Trial, option: Option, devices: tuple[int, ...], resume: checkpoint.CheckpointRecord | None
    ) -> JobRequest:
        session = TrialSession(trial, self._lock, self._clock, study=self.study, on_stop=self._on_stop)
        earlier = self._trial_runs[trial.number]
        self._trial_runs[trial.number] += 1
        return JobRequest(
            f"trial-{trial.number}" + (f".{earlier}" if earlier else ""),
            devices,
            (Task(session, self._strategies[option.strategy]),),
            self.run_dir / f"trial-{trial.number}.log",
            gradient_accumulation=option.gradient_accumulation,
            checkpoint={
                "dir": str(self.checkpoint_folder(trial.number)),
                "resume": None if resume is None else resume.to_json(),
            },
        )

    def profiling(self, job: ProfileJob, devices: tuple[int, ...]) -> JobRequest:
        warmup, timed = self._profile_steps
        # (a trial still in the study's queue, a FixedTrial, answers what a profiling run asks of it: its
        # suggestions and params; it reports nothing and restores no checkpoint)
        tasks = tuple(
            Task(
                TrialSession(cast(optuna.Trial, entry.trial), self._lock, self._clock, study=self.study),
                entry.strategies[0],
                profile={
                    "warmup": warmup,
                    "timed": timed,
                    "strategies": [s.to_json() for s in entry.strategies],
                    "gradient_accumulation": job.gradient_accumulation,
                },
            )
            for entry in job.entries
        )
        key = f"profile-{job.name}.{next(self._runs)}"
        return JobRequest(
            key,
            devices,
            tasks,
            self.run_dir / f"{safe(f'profile-{job.name}')}.log",
            gradient_accumulation=job.gradient_accumulation,
        )

    def checkpoint_folder(self, number: int) -> Path:
        return self._checkpoint_root / f"trial-{number}"


def run_folder(log_dir: Path, study_name: str) -> Path:
    """The folder of one sweep's logs (its trials', its workers'), under ``log_dir``: created, readable by this
    user alone."""
    folder = Path(log_dir) / f"{safe(study_name)}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder
