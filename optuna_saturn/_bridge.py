"""Everything a sweep says to the user's study, in one place.

Samplers and storages are used from one thread at a time: the scheduler's, and the channel's threads that answer
a worker's ``suggest`` or ``report``, all take the same lock (:attr:`StudyBridge.lock`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

ATTR = "saturn:"
_logger = optuna.logging.get_logger("optuna.saturn")


class StudyBridge:
    def __init__(self, study: optuna.Study, *, artifact_store: Any = None) -> None:
        self.study = study
        self.lock = threading.Lock()
        self._artifact_store = artifact_store
        self.stop_requested = False  # a callback called study.stop()

    def ask(self) -> optuna.Trial:
        with self.lock:
            return self.study.ask()

    def set_attrs(self, trial: optuna.Trial, attrs: dict[str, Any]) -> None:
        """``saturn:``-prefixed user attributes of a trial that is still running."""
        with self.lock:
            for key, value in attrs.items():
                trial.set_user_attr(ATTR + key, value)

    def tell(
        self,
        trial: optuna.Trial,
        state: TrialState,
        values: list[float] | None = None,
        *,
        attrs: dict[str, Any] | None = None,
        log: Path | None = None,
    ) -> FrozenTrial:
        """End a trial with its attributes. A failed trial's log goes to the artifact store, if there is one; a
        result the study refuses (say, a value of the wrong shape) fails the trial instead: the sweep goes on."""
        with self.lock:
            for key, value in (attrs or {}).items():
                trial.set_user_attr(ATTR + key, value)
            if state == TrialState.FAIL and log is not None:
                self._keep_log(trial, log)
            try:
                return self.study.tell(trial, values if state == TrialState.COMPLETE else None, state=state)
            except Exception as exc:
                trial.set_user_attr(ATTR + "fail_reason", f"could not record the result: {exc}")
                return self.study.tell(trial, state=TrialState.FAIL)

    def call_back(self, callbacks: Sequence[Callable[[optuna.Study, FrozenTrial], None]], trial: FrozenTrial) -> None:
        """Each callback with ``(study, frozen_trial)``, in order, as ``study.optimize`` calls them after a trial
        ends. An exception in one stops the sweep, as it stops ``study.optimize``. They run inside Optuna's
        optimize-loop flag, so ``study.stop()`` (``MaxTrialsCallback``, say) is allowed; it sets
        :attr:`stop_requested`, and the sweep stops asking."""
        if not callbacks:
            return
        local = self.study._thread_local
        was, local.in_optimize_loop, self.study._stop_flag = local.in_optimize_loop, True, False
        try:
            for callback in callbacks:
                callback(self.study, trial)
        finally:
            local.in_optimize_loop = was
            self.stop_requested = self.stop_requested or self.study._stop_flag
            self.study._stop_flag = False

    def fail(self, trial: optuna.Trial, reason: str, *, attrs: dict[str, Any] | None = None) -> FrozenTrial:
        return self.tell(trial, TrialState.FAIL, attrs={**(attrs or {}), "fail_reason": reason})

    def set_study_attr(self, key: str, value: Any) -> None:
        with self.lock:
            self.study.set_user_attr(ATTR + key, value)

    def _keep_log(self, trial: optuna.Trial, log: Path) -> None:
        if self._artifact_store is None or not log.exists():
            return
        from optuna.artifacts import upload_artifact

        artifact_id = upload_artifact(
            artifact_store=self._artifact_store, file_path=str(log), study_or_trial=trial, mimetype="text/plain",
        )
        trial.set_user_attr(ATTR + "log_artifact_id", artifact_id)
