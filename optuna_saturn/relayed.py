"""The Optuna side of the trial a worker's objective gets: every call is relayed to the executor, where the real
``optuna.Trial`` lives (so the study's own sampler and pruner decide), and every rank gets rank 0's answer.

Every rank calls the same trial methods in the same order. Rank 0 asks the executor; the answer is broadcast so all
ranks see the same hyperparameters and the same pruning decision (a pruned trial stops on every rank at the same
step, instead of leaving the others hanging in a collective: the failure of optuna-examples #101).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from optuna_saturn.channel import ChannelClient


class RelayedTrial:
    """``optuna.Trial``'s calls, relayed. Subclasses set ``_channel`` (rank 0's; None on the others), ``_group``
    (the job's gloo group), ``_profile`` (a profiling run's plan: nothing is reported then) and ``world_size``."""

    _channel: ChannelClient | None
    _group: Any
    _profile: dict | None

    @property
    def world_size(self) -> int:
        raise NotImplementedError

    def _ask_and_broadcast(self, op: str, **fields: Any) -> Any:
        """Rank 0 asks the parent; everyone gets rank 0's answer (or its error)."""
        answer: list[Any] = [None]
        if self._channel is not None:
            try:
                answer = [("ok", self._channel.call(op, **fields))]
            except Exception as exc:  # every rank must raise the same error, not just rank 0
                answer = [("error", exc)]
        if self.world_size > 1:
            dist.broadcast_object_list(answer, src=0, group=self._group)
        status, value = answer[0]
        if status == "error":
            raise value
        return value

    def _relay(self, op: str, **fields: Any) -> None:
        if self._channel is not None:
            self._channel.call(op, **fields)

    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False
    ) -> float:
        return float(
            self._ask_and_broadcast(
                "suggest", method="suggest_float", args=[name, low, high], kwargs={"step": step, "log": log}
            )
        )

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        return int(
            self._ask_and_broadcast(
                "suggest", method="suggest_int", args=[name, low, high], kwargs={"step": step, "log": log}
            )
        )

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        return self._ask_and_broadcast("suggest", method="suggest_categorical", args=[name, list(choices)], kwargs={})

    def report(self, value: float, step: int) -> None:
        """Report an intermediate value (rank 0's value is the one recorded)."""
        if self._profile is None:
            self._relay("report", value=float(value), step=int(step))

    def should_prune(self) -> bool:
        """The study's pruner decides, once, for all ranks."""
        return self._profile is None and bool(self._ask_and_broadcast("should_prune"))

    def set_user_attr(self, key: str, value: Any) -> None:
        if self._profile is None:
            self._relay("set_user_attr", key=key, value=value)

    @property
    def params(self) -> dict[str, Any]:
        return dict(self._ask_and_broadcast("params"))

    @property
    def study(self) -> Any:
        raise AttributeError(
            "The study lives in the executor's process, not in the worker. Use trial.suggest_*, report, "
            "should_prune and set_user_attr, which are relayed to it."
        )
