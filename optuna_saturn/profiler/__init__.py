"""The empirical profiler: how long a step of a trial takes under each (strategy, device count), and whether it
fits, measured by short real runs and cached by what affects speed (DESIGN decision 5)."""

from optuna_saturn.profiler._description import DescribeFailed, DescribeTimedOut, NothingToDescribe
from optuna_saturn.profiler._hardware import hardware_fingerprint
from optuna_saturn.profiler._memory import model_state_bytes
from optuna_saturn.profiler._probe import Work, Workload, probe_workload
from optuna_saturn.profiler._store import ProfileRecord, ProfileStore, profile_key

__all__ = [
    "DescribeFailed",
    "DescribeTimedOut",
    "NothingToDescribe",
    "ProfileRecord",
    "ProfileStore",
    "Work",
    "Workload",
    "hardware_fingerprint",
    "model_state_bytes",
    "probe_workload",
    "profile_key",
]
