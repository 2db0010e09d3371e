"""Each trial's description (its workload), as the pricer keeps it: described once, in a process of the pool.

A description ends one of three ways (:meth:`~optuna_saturn.pools.processes.ProcessPool.describe`): a workload; a
``RuntimeError`` where the objective cannot be described this way, or not within the describe limit (it is then
planned from runtime estimates); or :class:`~optuna_saturn.profiler.DescribeFailed` where it exited or was killed
(it then fails without a run).
An objective that prepares no model at all (:class:`~optuna_saturn.profiler.NothingToDescribe`) is not run again to
describe later trials: each of them runs once, in a worker, as under plain Optuna.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna

from optuna_saturn.profiler import DescribeFailed, DescribeTimedOut, NothingToDescribe, Workload

_logger = optuna.logging.get_logger("optuna.saturn.profiler")


#: Descriptions past the describe limit after which a sweep describes no more trials: each costs the sweep its wait
#: (an objective whose set-up always takes longer, a plain one whose whole body does, would cost it at every trial).
TIMEOUTS_BEFORE_ESTIMATES = 2


class Descriptions:
    """Trials' workloads, described on first use by ``describe``."""

    def __init__(self, describe: Callable[[Any], Workload]) -> None:
        self._describe = describe
        self._workloads: dict[int, Workload | None] = {}
        self._failures: dict[int, DescribeFailed] = {}  # trials whose objective exited while described
        self._nothing_to_describe = False  # the objective prepared no model: no trial is described again
        self._timed_out = 0  # descriptions that passed the describe limit: past TIMEOUTS_BEFORE_ESTIMATES, none more
        self._warned = False

    def of(self, trial: Any) -> Workload | None:
        """The trial's workload (its hyperparameters are decided as it is described), or None: it cannot be
        described, or its objective exited while described (:meth:`failure`)."""
        if trial.number not in self._workloads:
            self._workloads[trial.number] = None
            if not self._nothing_to_describe and self._timed_out < TIMEOUTS_BEFORE_ESTIMATES:
                self._workloads[trial.number] = self._described(trial)
        return self._workloads[trial.number]

    def _described(self, trial: Any) -> Workload | None:
        try:
            return self._describe(trial)
        except DescribeFailed as exc:
            self._failures[trial.number] = exc
        except DescribeTimedOut as exc:
            self._timed_out += 1
            more = (
                "Its later trials are not described either (the sweep waits for each description): all are planned "
                "from estimates."
                if self._timed_out >= TIMEOUTS_BEFORE_ESTIMATES
                else ""
            )
            _logger.warning(
                f"Trial {trial.number} is planned from estimates: {exc}. It runs now; if it hangs there too, it "
                f"ends FAIL after its start-up limit. Pass a larger describe_timeout= if your objective's set-up "
                f"takes longer. {more}".rstrip()
            )
        except RuntimeError as exc:
            self._nothing_to_describe = isinstance(exc, NothingToDescribe)
            if self._nothing_to_describe:  # (a plain objective is a drop-in's first case, not a fault)
                _logger.info(
                    f"Trial {trial.number}'s objective prepares nothing for a strategy to choose (no trial.prepare, "
                    "Trainer or Accelerator): its trials run as they are, one device each, as under study.optimize."
                )
            elif not self._warned:
                _logger.warning(f"Trial {trial.number} cannot be profiled ({exc}); it is planned from estimates.")
                self._warned = True
        return None

    @property
    def prepares_nothing(self) -> bool:
        """The objective prepared nothing for a strategy when it was described (a plain objective)."""
        return self._nothing_to_describe

    def forget(self, number: int) -> None:
        """Trial ``number`` was a stand-in (a trial the study never saw): the next trial of that number is described
        afresh."""
        self._workloads.pop(number, None)
        self._failures.pop(number, None)

    def known(self, number: int) -> Workload | None:
        """Trial ``number``'s workload, if it was described (describing nothing)."""
        return self._workloads.get(number)

    def failure(self, number: int) -> DescribeFailed | None:
        """Why trial ``number`` fails without a run, if its objective exited while described."""
        return self._failures.get(number)
