"""Profiles on disk: one small JSON file per key, written atomically, so concurrent sweeps can share a store."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from optuna_saturn.strategy import Strategy


#: Bumped when a profile measures something new; older profiles are then measured again, not trusted as they are
#: (2: the objective after its loop, the launch's exit, and out-of-memory answers that allow more micro-batches).
PROFILE_FORMAT = 2


def profile_key(
    model_signature: str, batch_signature: str, strategy: Strategy, devices: int, hardware: str,
    gradient_accumulation: int = 1,
) -> str:
    """What affects speed, and nothing else (never the learning rate). The list of accumulation factors a
    strategy may try is not part of it: only the factor this measurement ran with."""
    knobs = {k: v for k, v in strategy.knobs.items() if k != "gradient_accumulation"}
    parts = {
        "format": PROFILE_FORMAT, "model": model_signature, "batch": batch_signature, "strategy": strategy.name,
        "engine": strategy.engine, "knobs": knobs, "config": dict(strategy.launcher_config),
        "devices": devices, "hardware": hardware,
    }
    if gradient_accumulation > 1:
        parts["gradient_accumulation"] = gradient_accumulation
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


@dataclass
class ProfileRecord:
    """One measured (workload, strategy, device count, accumulation). ``feasible`` is False when the run ran out
    of memory or cannot run this way at all. ``more_micro_batches_may_fit`` when it ran out of memory in the
    training steps (activations), not while setting up (the model itself)."""

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
    timed_steps: int = 0
    error: str = ""
    more_micro_batches_may_fit: bool = False
    gradient_accumulation: int = 1
    n_params: int = 0
    batch_signature: str = ""
    measured_at: float = field(default_factory=time.time)

    @property
    def after_loop_seconds(self) -> float:
        return (self.tail_seconds or 0.0) + (self.exit_seconds or 0.0)

    @property
    def observed(self) -> bool:
        """Priced by real trials' step rate already, not by the timed steps."""
        return self.observed_step_seconds is not None

    def whole_trial_seconds(self, total_steps: int) -> float | None:
        """Start-up, every step at the measured rate, what follows the loop and the exit, each measured. Once
        real trials ran as this profile, their step rate (evaluation passes in the loop included) is used."""
        if not self.feasible or self.step_seconds is None:
            return None
        step = self.observed_step_seconds or self.step_seconds
        return (self.startup_seconds or 0.0) + total_steps * step + self.after_loop_seconds


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
        return ProfileRecord(**data)

    def put(self, record: ProfileRecord) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(asdict(record), f, indent=1, sort_keys=True)
        os.replace(tmp, self.folder / f"{record.key}.json")

    def __len__(self) -> int:
        return len(list(self.folder.glob("*.json"))) if self.folder.is_dir() else 0
