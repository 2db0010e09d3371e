"""The Optuna side of the trial a worker's objective gets: every call is relayed to the executor, where the real
``optuna.Trial`` lives (so the study's own sampler and pruner decide), and every rank gets rank 0's answer.

Every rank calls the same trial methods in the same order. Rank 0 asks the executor; the answer is broadcast so all
ranks see the same hyperparameters and the same pruning decision (a pruned trial stops on every rank at the same
step, instead of leaving the others hanging in a collective: the failure of optuna-examples #101).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import torch.distributed as dist
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
    json_to_distribution,
)

from optuna_saturn.channel import ChannelClient
from optuna_saturn.study_view import StudyView


class RelayedTrial:
    """``optuna.Trial``'s calls, relayed. Subclasses set ``_channel`` (rank 0's; None on the others), ``_group``
    (the job's gloo group), ``_profile`` (a profiling run's plan: nothing is reported then), ``_known`` (the
    real trial at the run's start: :mod:`optuna_saturn.study.trial_snapshot`) and ``world_size``.

    Every public member of ``optuna.Trial`` is here (``tests/test_trial_members.py`` compares the lists with the
    installed Optuna). Suggestions and pruning are asked of the real trial; reads (``params``, ``user_attrs``,
    ``study``, ...) answer from the snapshot and this run's own calls, on any rank alone."""

    _channel: ChannelClient | None
    _group: Any
    _profile: dict | None
    _known: dict[str, Any]

    _number: int

    @property
    def world_size(self) -> int:
        raise NotImplementedError

    @property
    def number(self) -> int:
        """The trial's number in the study, as Optuna's."""
        return self._number

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

    def _suggest(self, method: str, name: str, args: list[Any], kwargs: dict[str, Any], distribution: Any) -> Any:
        value = self._ask_and_broadcast("suggest", method=method, args=[name, *args], kwargs=kwargs)
        known = self._known_part("params")
        if name not in known:  # (a second suggestion of a name returns the first value, as Optuna does)
            known[name] = value
            self._known_part("distributions")[name] = distribution
        return value

    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False
    ) -> float:
        distribution = FloatDistribution(low, high, log=log, step=step)
        return float(self._suggest("suggest_float", name, [low, high], {"step": step, "log": log}, distribution))

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        distribution = IntDistribution(low, high, log=log, step=step)
        return int(self._suggest("suggest_int", name, [low, high], {"step": step, "log": log}, distribution))

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        choices = list(choices)
        return self._suggest("suggest_categorical", name, [choices], {}, CategoricalDistribution(choices))

    def suggest_uniform(self, name: str, low: float, high: float) -> float:
        """Optuna's deprecated spelling of ``suggest_float(name, low, high)`` (it warns in your process)."""
        return float(self._suggest("suggest_uniform", name, [low, high], {}, FloatDistribution(low, high)))

    def suggest_loguniform(self, name: str, low: float, high: float) -> float:
        """Optuna's deprecated spelling of ``suggest_float(name, low, high, log=True)``."""
        distribution = FloatDistribution(low, high, log=True)
        return float(self._suggest("suggest_loguniform", name, [low, high], {}, distribution))

    def suggest_discrete_uniform(self, name: str, low: float, high: float, q: float) -> float:
        """Optuna's deprecated spelling of ``suggest_float(name, low, high, step=q)``."""
        distribution = FloatDistribution(low, high, step=q)
        return float(self._suggest("suggest_discrete_uniform", name, [low, high, q], {}, distribution))

    def report(self, value: float, step: int) -> None:
        """Report an intermediate value (rank 0's value is the one recorded)."""
        self._single_objective("Trial.report")
        if self._profile is None:
            self._relay("report", value=float(value), step=int(step))

    def should_prune(self) -> bool:
        """The study's pruner decides, once, for all ranks."""
        self._single_objective("Trial.should_prune")
        return self._profile is None and bool(self._ask_and_broadcast("should_prune"))

    def set_user_attr(self, key: str, value: Any) -> None:
        """Set on the real trial by rank 0 (a profiling run sets nothing); this trial's ``user_attrs`` has it at
        once, on every rank that called it."""
        self._known_part("user_attrs")[key] = value
        if self._profile is None:
            self._relay("set_user_attr", key=key, value=value)

    def set_constraint(self, key: str, value: float) -> None:
        """A constraint value for constrained optimisation (feasible where every one is zero or less), set on the
        real trial by rank 0, as Optuna's ``Trial.set_constraint``."""
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"The `value` argument is of type '{type(value)}' but supposed to be a float.") from None
        if value != value:
            raise ValueError(f"Attempted to set a constraint for {key!r}, but NaN is not allowed.")
        self._known_part("constraints").setdefault(key, value)  # (Optuna keeps the first, and warns)
        if self._profile is None:
            self._relay("set_constraint", key=key, value=value)

    def _single_objective(self, what: str) -> None:
        """As Optuna's trial, every rank alike (from the study's directions, without asking): a multi-objective
        study has no intermediate values and no pruning."""
        if len((self._known.get("study") or {}).get("directions") or ()) > 1:
            raise NotImplementedError(f"{what} is not supported for multi-objective optimization.")

    def _known_part(self, name: str) -> dict[str, Any]:
        part: dict[str, Any] = self._known.setdefault(name, {})  # (its parts are dicts: params, user_attrs, ...)
        return part

    @property
    def params(self) -> dict[str, Any]:
        """The parameters suggested so far (those the trial was described with included)."""
        return dict(self._known_part("params"))

    @property
    def distributions(self) -> dict[str, BaseDistribution]:
        return {
            name: json_to_distribution(d) if isinstance(d, str) else d
            for name, d in self._known_part("distributions").items()
        }

    @property
    def user_attrs(self) -> dict[str, Any]:
        """The trial's user attributes as the run started (``saturn:*`` ones included), and those it set since."""
        return dict(self._known_part("user_attrs"))

    @property
    def constraints(self) -> dict[str, float]:
        return dict(self._known_part("constraints"))

    @property
    def relative_params(self) -> dict[str, Any]:
        """What the sampler sampled jointly for this trial (a multivariate sampler's), decided when it was asked."""
        return dict(self._known_part("relative_params"))

    @property
    def datetime_start(self) -> datetime.datetime | None:
        started = self._known.get("datetime_start")
        return None if started is None else datetime.datetime.fromisoformat(started)

    @property
    def study(self) -> StudyView:
        """A read-only view of the study: its name, directions and user attributes (the study itself lives in
        the executor's process; do anything else with it in a callback)."""
        return StudyView(self._known.get("study") or {}, stop=self._stop_study)

    def _stop_study(self) -> None:
        """``trial.study.stop()``: the sweep asks no trial after this one (a profiling run's asks nothing)."""
        if self._profile is None:
            self._relay("stop_study")
