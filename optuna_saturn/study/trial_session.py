"""The parent's side of one launched trial: it answers the worker's requests with the real ``optuna.Trial``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import optuna

from optuna_saturn.clock import Clock
from optuna_saturn.study.attr_writes import set_records_of
from optuna_saturn.study.outbox import STORAGE_ERRORS, retrying
from optuna_saturn.study.records import ATTR
from optuna_saturn.study.trial_snapshot import trial_snapshot

_SUGGEST_METHODS = frozenset(
    {
        "suggest_float",
        "suggest_int",
        "suggest_categorical",
        "suggest_uniform",
        "suggest_loguniform",
        "suggest_discrete_uniform",
    }
)


#: What a run whose trial another sweep ended is answered (see :meth:`TrialSession._call_trial_locked`).
_TAKEN_OVER_ANSWERS: dict[str, Any] = {
    "should_prune": True,
    "report": None,
    "set_user_attr": None,
    "set_constraint": None,
}


class TrialSession:
    """Serves one trial's channel and records how far it got and how it ended.

    All calls into Optuna happen under the sweep's study lock: samplers and storages are then used from one
    thread at a time, whichever worker asks.
    """

    def __init__(
        self,
        trial: optuna.Trial,
        study_lock: threading.Lock,
        clock: Clock,
        *,
        study: optuna.Study | None = None,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        """``on_stop``: what the objective's ``trial.study.stop()`` does (None: nothing, in a description)."""
        self.trial = trial
        self._on_stop = on_stop
        self._study = study  # (a queued trial, measured before it is taken, knows no study of its own)
        self._lock = study_lock
        self._clock = clock
        self.outcome: dict[str, Any] | None = None
        self.profiles: list[dict[str, Any]] = []  # one per strategy timed by a profiling launch
        self.outcome_at: float | None = None
        self.objective_started_at: float | None = None
        self.first_step_at: float | None = None
        self.last_progress_at: float | None = None
        self.step = 0
        self.total_steps: int | None = None
        self.step_seconds: float | None = None
        self.resumed_from = 0  # the step the run resumed from its checkpoint (its steps before ran earlier)
        self.checkpoint: dict[str, Any] | None = None  # the latest checkpoint the run saved (its record)
        self.checkpoint_steps: list[int] = []  # the steps the run checkpointed at
        self.checkpoint_seconds = 0.0  # how long its latest checkpoint took to save
        self.move_requested = False  # the sweep moves the trial elsewhere at its next checkpoint (elastic resize)
        self.taken_over = False  # another sweep ended the trial (it took this one for dead): the run is to stop
        # the storage stayed down past the retry budget while the run asked something of the trial: the run fails,
        # but not by its code's fault, so it runs again (the faults policy)
        self.storage_failed = False
        self._reported: set[int] | None = None  # steps with an intermediate value (inherited ones included)
        self._loops: dict[int, int] = {}  # loop index -> its steps (epochs, when the objective loops per epoch)

    def snapshot(self) -> dict[str, Any]:
        """The real trial as a run starts, for the worker's trial to read without asking."""

        def take() -> dict[str, Any]:
            with self._lock:
                return trial_snapshot(self.trial, self._study)

        return retrying(take, what=f"read trial {self.trial.number}")

    def handle(self, op: str, message: dict) -> Any:
        if op == "hello":
            return {"number": self.trial.number}
        if op == "closed":  # rank 0 closed the channel: its outcome, if any, came before
            return None
        if op == "started":  # the objective is called now (what came before was the worker's own set-up)
            self.objective_started_at = self._clock.now()
            return None
        if op == "progress":
            return self._progress(message)
        if op == "stop_study":
            if self._on_stop is not None:
                self._on_stop()
            return None
        if op == "profile":
            self.profiles.append(message)
            self.outcome_at = self._clock.now()
            return None
        if op == "checkpointed":
            return self._checkpointed(message["record"], float(message.get("seconds", 0.0)))
        if op in ("result", "pruned", "fail", "moved"):
            self.outcome = {"op": op, **{k: v for k, v in message.items() if k != "op"}}
            self.outcome_at = self._clock.now()
            return None
        # (a storage restarting answers again: its calls wait for it, the worker's with them)
        try:
            return retrying(
                lambda: self._call_trial_locked(op, message), what=f"answer trial {self.trial.number}'s {op}"
            )
        except STORAGE_ERRORS:
            self.storage_failed = True
            raise

    def _call_trial_locked(self, op: str, message: dict) -> Any:
        """A run whose trial another sweep ended (it took this sweep for dead) is told to prune itself, and its
        writes are dropped: the trial is no longer this run's, and the faults policy stops the run anyway."""
        with self._lock:
            if self.taken_over and op in _TAKEN_OVER_ANSWERS:
                return _TAKEN_OVER_ANSWERS[op]
            try:
                return self._call_trial(op, message)
            except optuna.exceptions.UpdateFinishedTrialError:
                self.taken_over = True  # (the trial ended under this run: another sweep ended it)
                if op in _TAKEN_OVER_ANSWERS:
                    return _TAKEN_OVER_ANSWERS[op]
                raise

    def _call_trial(self, op: str, message: dict) -> Any:
        if op == "suggest":
            method = message["method"]
            if method not in _SUGGEST_METHODS:
                raise ValueError(f"{method} cannot be relayed; use one of {sorted(_SUGGEST_METHODS)}.")
            return getattr(self.trial, method)(*message["args"], **message["kwargs"])
        if op == "report":
            self._report(float(message["value"]), int(message["step"]))
            return None
        if op == "should_prune":
            return self.trial.should_prune()
        if op == "set_user_attr":
            self.trial.set_user_attr(message["key"], message["value"])
            return None
        if op == "set_constraint":
            self.trial.set_constraint(message["key"], float(message["value"]))
            return None
        if op == "params":
            return self.trial.params
        raise ValueError(f"Unknown request {op!r} from a worker.")

    def _report(self, value: float, step: int) -> None:
        """An intermediate value, once per step: a run resumed from a checkpoint reports again the steps after
        it that the first run had reported (and the trial inherited); those are left as they were."""
        if self._reported is None:
            frozen = self.trial.study._storage.get_trial(self.trial._trial_id)
            self._reported = set(frozen.intermediate_values)
        if step in self._reported:
            return
        self.trial.report(value, step)
        self._reported.add(step)

    def _checkpointed(self, record: dict, seconds: float) -> bool:
        """Records the checkpoint; answers whether the run is to stop here, to be moved (the sweep asked)."""
        self.checkpoint, self.checkpoint_seconds = record, seconds
        self.checkpoint_steps.append(int(record["step"]))

        def record_it() -> None:
            with self._lock:
                set_records_of(self.trial.study._storage, self.trial, {ATTR + "checkpoint": record})

        try:
            retrying(record_it, what=f"record trial {self.trial.number}'s checkpoint")
        except optuna.exceptions.UpdateFinishedTrialError:
            # (see _call_trial_locked) an error, not an answer: a worker told its record was stored would prune
            # the checkpoint before it, which the other sweep's retry resumes from
            self.taken_over = True
            raise
        return self.move_requested

    def _progress(self, message: dict) -> None:
        now = self._clock.now()
        if self.first_step_at is None:
            self.first_step_at = now
        self.last_progress_at = now
        self.step, self.total_steps = int(message["step"]), int(message["total"])
        self.resumed_from = int(message.get("resumed", 0))
        self._loops[int(message.get("loop", 0))] = int(message.get("loop_total", self.total_steps))
        ran = self.step - self.resumed_from
        if ran > 1 and message.get("elapsed") is not None:  # (a simulated run may keep its rate unknown)
            self.step_seconds = float(message["elapsed"]) / ran
        return None

    @property
    def loop_steps(self) -> list[int]:
        """Each ``trial.steps(n)`` loop's ``n`` that the trial reported, in order."""
        return [self._loops[i] for i in sorted(self._loops)]
