"""Taking trials into the sweep, as the asking policy (:mod:`optuna_saturn.sweep.asking`) decides: the study's
queue's next fixed trials are described ahead, while still in the queue (so another sweep may yet take them);
otherwise a trial is taken from the queue or asked of the sampler, owned, priced and admitted to the waiting
trials. Mechanism only: what to do next is the policy's call, and every write goes through the loop's actions."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from optuna_saturn.study.outbox import retrying
from optuna_saturn.study.ownership import inherit_intermediate_values
from optuna_saturn.study.queue import ParameterNotFixed, QueuedTrial
from optuna_saturn.sweep.actions import Actions
from optuna_saturn.sweep.asking import Asking, Next
from optuna_saturn.sweep.options import OptionsView
from optuna_saturn.sweep.state import SweepState


class Admission:
    def __init__(
        self,
        state: SweepState,
        asking: Asking,
        view: OptionsView,
        do: Actions,
        *,
        now: Callable[[], float],
        plan: Callable[[], None],
    ) -> None:
        self._state, self._asking, self._view, self._do = state, asking, view, do
        self._now, self._plan = now, plan

    def ask(self) -> None:
        """Admit trials while the policy asks for more."""
        queue, gateway = self._do.queue, self._do.gateway
        while self.may_ask():
            if self._asking.room_to_describe(self._state) and self._describe_queued():
                continue
            step = self._asking.next(self._state, self._now(), self._view)
            if step is None:
                return
            if step is Next.PLAN_FIRST:
                self._plan()
                continue
            asked_at, queued = self._now(), queue.next_unseen(set(self._state.waiting))
            trial = gateway.ask_new() if queued is None else queue.take(queued)
            if trial is None:
                continue  # another sweep took it from the queue first
            self._do.own(trial)
            number = trial.number
            retrying(partial(inherit_intermediate_values, gateway, trial), what=f"read trial {number}'s first run")
            self._state.resumes[number] = retrying(
                partial(self._do.resumes.inherited, trial), what=f"read trial {number}'s checkpoint"
            )
            price = self._do.price(trial, describe=self._asking.describes_asked)
            self._asking.asked(self._now() - asked_at)
            self._do.admit(trial, price, asked_at, self._now(), profile_everything=self._asking.profile_only)

    def may_ask(self) -> bool:
        """Whether the asking policy takes more trials now."""
        return self._asking.may_ask(self._state, self._now(), self._do.gateway.stop_requested)

    def _describe_queued(self) -> bool:
        """Describe the queue's next trial from its fixed parameters, leaving it in the queue; False if there is
        none to describe (it samples, or it is a retry: it is asked instead)."""
        queue = self._do.queue
        queued = queue.next_unseen(set(self._state.waiting))
        if queued is None or not queue.may_describe(queued):
            return False
        started, known = self._now(), QueuedTrial(queued)
        self._state.resumes[known.number] = None
        try:
            price = self._do.price(known, describe=True)
        except ParameterNotFixed as exc:
            queue.samples(queued.number, str(exc))
            return False
        self._asking.asked(self._now() - started)
        trial = known if price.options else queue.take(known)  # (taken to fail it, as an asked one)
        if trial is not None and not price.options:
            self._do.own(trial)
        if trial is not None:
            self._do.admit(trial, price, started, self._now())
        return True
