"""Where a prepared DataLoader's current pass stands, so that a run resumed from a checkpoint taken mid-epoch goes
on with the batches the first run would have trained on next.

A shuffling loader decides its pass's order when the pass begins (``iter()`` draws a seed from the global
generators, or from the loader's own). Each prepared loader keeps the random states it began its current pass
with and how many batches that pass has yielded; a checkpoint saves that. In the run that resumes, the loader's
first pass begins again from those states and skips (loads, and drops) the batches already trained on; then the
random states are set back to the checkpoint's, as if the run had never stopped. Skipping costs what loading
those batches costs, not their training. A pass that had ended is not replayed: the next pass draws its order
from the checkpoint's states, as the first run's next pass did.

Create the pass's iterator after ``trial.restore`` (``iter(loader)`` or a ``for`` loop over it): an iterator made
before it cannot be put back. A loader with ``persistent_workers=True`` reuses its iterator across passes, which a
new process cannot: its passes are not replayed (a run resumed mid-epoch sees the rest of that epoch in another
order).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from optuna_saturn.training.random_state import capture, restore
from optuna_saturn.training.sharding import LoaderView


class PositionedLoader(LoaderView):
    """A prepared DataLoader that knows where its current pass is (see the module's docstring)."""

    def __init__(self, loader: DataLoader) -> None:
        super().__init__(loader)
        self._generators = [g for g in (self.generator, getattr(self.sampler, "generator", None)) if g is not None]
        self._pass_states: dict[str, Any] | None = None
        self._yielded = 0
        self._ended = True
        self._passes = 0  # passes begun
        self._resume: dict[str, Any] | None = None
        users = loader
        while isinstance(users, LoaderView):  # (a rank's view: the user's loader underneath)
            users = users.loader
        self._persistent = bool(getattr(users, "persistent_workers", False))

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # torch types it as a private iterator
        resume, self._resume = self._resume, None
        if resume is not None and resume.get("states") is None:  # between passes: the loader's own generators
            for generator, state in zip(self._generators, resume.get("generators", [])):
                generator.set_state(state)
            resume = None
        now = None
        if resume is not None:
            now = capture()  # the checkpoint's global states (trial.restore set them)
            restore(resume["states"], self._generators)
        self._pass_states, self._yielded, self._ended = capture(self._generators), 0, False
        self._passes += 1
        batches = iter(self.loader)
        if resume is not None:
            for _ in range(int(resume["yielded"])):
                if next(batches, _END) is _END:
                    break
                self._yielded += 1
            assert now is not None  # (captured above, for the same resume)
            restore(now)  # (the loader's own generators stay where replaying the pass left them)
        return self._counted(batches, self._passes)

    def _counted(self, batches: Iterator[Any], this_pass: int) -> Iterator[Any]:
        try:
            for batch in batches:
                self._yielded += 1
                yield batch
        finally:  # exhausted, or left (a ``break`` closes the iterator): the next pass starts anew
            # (unless a newer pass began already: a loop that makes its next iterator before it drops the last
            # one, as Lightning's does at an epoch's start, closes the old pass after the new one began)
            if this_pass == self._passes:
                self._ended = True

    def position(self) -> dict[str, Any] | None:
        """Its current pass's start and progress; between passes, its own generators' states (or None)."""
        between = (
            {"states": None, "generators": [g.get_state() for g in self._generators]} if self._generators else None
        )
        if self._pass_states is None or self._ended or self._persistent:
            return between
        try:
            if self._yielded >= len(self):
                return between
        except TypeError:  # an IterableDataset without a length: ended only when it said so
            pass
        return {"states": self._pass_states, "yielded": self._yielded}

    def resume_at(self, position: dict[str, Any] | None) -> None:
        """Its next pass goes on from ``position`` (what :meth:`position` gave in the run that checkpointed)."""
        self._resume = position


_END = object()
