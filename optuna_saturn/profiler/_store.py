"""Profiles on disk: one small JSON file per key, written atomically, so concurrent sweeps can share a store."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from optuna_saturn.strategy import Strategy

#: Bumped when a profile measures something new; older profiles are then measured again, not trusted as they are
#: (2: the objective after its loop, the launch's exit, and out-of-memory answers that allow more micro-batches;
#: 3: batch shapes from a collated batch, library versions, later loops counted; 4: warm workers (no process start
#: in the start-up), the work a step does for the cost model).
PROFILE_FORMAT = 4


@functools.cache
def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def library_versions(strategy: Strategy) -> dict[str, str]:
    """The libraries whose version changes a strategy's speed: torch always, and those its engine runs on."""
    return {library: _version(library) for library in ("torch", *strategy.engine_traits.libraries)}


def profile_key(
    model_signature: str,
    batch_signature: str,
    strategy: Strategy,
    devices: int,
    hardware: str,
    gradient_accumulation: int = 1,
) -> str:
    """What affects speed, and nothing else (never the learning rate). The list of accumulation factors a
    strategy may try is not part of it: only the factor this measurement ran with."""
    knobs = {k: v for k, v in strategy.knobs.items() if k != "gradient_accumulation"}
    parts = {
        "format": PROFILE_FORMAT,
        "model": model_signature,
        "batch": batch_signature,
        "strategy": strategy.name,
        "engine": strategy.engine,
        "knobs": knobs,
        "config": dict(strategy.launcher_config),
        "devices": devices,
        "hardware": hardware,
        "versions": library_versions(strategy),
    }
    if gradient_accumulation > 1:
        parts["gradient_accumulation"] = gradient_accumulation
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


@dataclass
class ProfileRecord:
    """One measured (workload, strategy, device count, accumulation). ``feasible`` is False when the run ran out
    of memory or cannot run this way at all. ``more_micro_batches_may_fit`` when it ran out of memory in the
    training steps (activations), not while setting up (the model itself). ``failed``: the option crashed or
    refused this trial's code; such a record belongs to its trial and is never stored."""

    key: str
    strategy: str
    devices: int
    hardware: str
    feasible: bool
    step_seconds: float | None = None
    startup_seconds: float | None = None
    tail_seconds: float | None = None  # the objective after its training loop: final evaluation, saving
    exit_seconds: float | None = None  # from the result to the launch's processes having exited
    observed_step_seconds: float | None = None  # mean real step rate of trials that ran as this profile
    observed_runs: int = 0
    peak_memory_bytes: int | None = None
    reserved_memory_bytes: int | None = None  # the CUDA allocator's peak reserve (fragmentation included)
    near_capacity: bool = False  # its peak was within NEAR_CAPACITY of the device: it may run out later
    step_spread: float | None = None  # the timed steps' slowest over fastest
    timed_steps: int = 0
    error: str = ""
    more_micro_batches_may_fit: bool = False
    gradient_accumulation: int = 1
    n_params: int = 0
    batch_signature: str = ""
    work_flops: float = 0.0  # what a step of this workload computes, for the cost model
    work_param_bytes: float = 0.0
    loop_steps: list[int] = field(default_factory=list)  # every trial.steps(n) loop's n in the profiled run
    between_seconds: float | None = None  # the objective's time between its first two loops (an epoch's end)
    failed: bool = False
    measured_at: float = field(default_factory=time.time)

    @property
    def after_loop_seconds(self) -> float:
        """After the last loop: the rest of the objective and the launch's exit. With several loops the profile
        ran the end quickly (few batches per pass), so the full time between two loops bounds it from below."""
        tail = self.tail_seconds or 0.0
        if len(self.loop_steps) > 1:
            tail = max(tail, self.between_seconds or 0.0)
        return tail + (self.exit_seconds or 0.0)

    def trial_steps(self, first_loop_steps: int) -> float:
        """All steps of a trial whose first loop has ``first_loop_steps``, with the loops the profile counted."""
        if len(self.loop_steps) < 2 or not self.loop_steps[0]:
            return float(first_loop_steps)
        return first_loop_steps * sum(self.loop_steps) / self.loop_steps[0]

    def between_loops_seconds(self) -> float:
        return (len(self.loop_steps) - 1) * (self.between_seconds or 0.0) if len(self.loop_steps) > 1 else 0.0

    @property
    def observed(self) -> bool:
        """Priced by real trials' step rate already, not by the timed steps."""
        return self.observed_step_seconds is not None

    def whole_trial_seconds(self, first_loop_steps: int) -> float | None:
        """Start-up, every step of every loop at the measured rate, the time between loops, what follows the last
        loop and the exit, each measured. Once real trials ran as this profile, their step rate (evaluation
        passes and the time between loops included) is used instead of the timed steps and the gaps."""
        if not self.feasible or self.step_seconds is None:
            return None
        steps = self.trial_steps(first_loop_steps)
        if self.observed_step_seconds:
            loops = steps * self.observed_step_seconds
        else:
            loops = steps * self.step_seconds + self.between_loops_seconds()
        return (self.startup_seconds or 0.0) + loops + self.after_loop_seconds


class ProfileStore:
    """A folder of profiles (default: ``profiles/`` in the working directory), reused across trials, sweeps and
    restarts."""

    def __init__(self, folder: str | os.PathLike = "profiles") -> None:
        self.folder = Path(folder)

    def get(self, key: str) -> ProfileRecord | None:
        try:
            data = json.loads((self.folder / f"{key}.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return None  # a damaged file is re-measured, not trusted
        try:
            return ProfileRecord(**data)
        except TypeError:
            return None  # written by another version: re-measured

    def put(self, record: ProfileRecord) -> None:
        if record.failed:
            raise ValueError("a failed profile belongs to its trial and is not stored")
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(asdict(record), f, indent=1, sort_keys=True)
        os.replace(tmp, self.folder / f"{record.key}.json")

    def __len__(self) -> int:
        return len(list(self.folder.glob("*.json"))) if self.folder.is_dir() else 0

    def records(self) -> list[ProfileRecord]:
        """Every readable profile of this format, oldest first (what the cost model learns from)."""
        if not self.folder.is_dir():
            return []
        found = [self.get(path.stem) for path in self.folder.glob("*.json") if not path.name.startswith(".tmp")]
        return sorted((r for r in found if r is not None and r.key), key=lambda r: r.measured_at)
