"""``trial.study`` inside a worker: a read-only view of the study as the trial's run started.

Why a view and not the study: the study (its sampler, pruner and storage connection) lives in the executor's
process, and its state changes under the sweep's lock there; a worker holding a second copy would read trials
half-written and could ask trials behind the sweep's back. What objectives read of it in practice (its name for a
run folder, its direction, its attributes) is here; everything else gets an error that says where to do it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from optuna.study import StudyDirection

#: What the view offers.
OFFERED = ("study_name", "direction", "directions", "user_attrs", "stop()")


class StudyView:
    """The study's name, directions and user attributes, as the trial's run started, and ``stop()``."""

    def __init__(self, known: dict[str, Any], *, stop: Callable[[], None] | None = None) -> None:
        self._known = known
        self._stop = stop

    def stop(self) -> None:
        """As ``study.stop()`` inside ``study.optimize``: no trial is asked after this one; those asked finish."""
        if self._stop is not None:
            self._stop()

    def optimize(self, *args: Any, **kwargs: Any) -> None:
        """Refused, as ``study.optimize`` refuses to be called from its own objective (the same exception)."""
        raise RuntimeError("Nested invocation of `Study.optimize` method isn't allowed.")

    @property
    def study_name(self) -> str:
        return str(self._known.get("study_name", ""))

    @property
    def directions(self) -> list[StudyDirection]:
        return [StudyDirection[name] for name in self._known.get("directions", ["MINIMIZE"])]

    @property
    def direction(self) -> StudyDirection:
        directions = self.directions
        if len(directions) > 1:
            raise RuntimeError(
                "A single direction cannot be retrieved from a multi-objective study. Consider using "
                "study.directions to retrieve a list containing all directions."
            )
        return directions[0]

    @property
    def user_attrs(self) -> dict[str, Any]:
        return dict(self._known.get("user_attrs", {}))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(
            f"trial.study.{name} is not available inside a worker: the study lives in the executor's process, "
            f"and the objective sees a read-only view of it ({', '.join(OFFERED)}) as its trial's run started. "
            f"Read {name} in a callback (SaturnExecutor(...).optimize(..., callbacks=[f]) calls f(study, trial) "
            "in your process after each trial), or before the sweep, and pass what the objective needs to it."
        )

    def __repr__(self) -> str:
        return f"StudyView(study_name={self.study_name!r}, directions={[d.name for d in self.directions]})"
