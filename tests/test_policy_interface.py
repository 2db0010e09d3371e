"""The policies' one interface (:mod:`optuna_saturn.sweep.policy`): every kind of decision has exactly one handler,
and a rule joins a sweep as one more entry in the list of policies, whose hooks the loop calls and whose decisions
it has carried out. Simulated sweeps: no process starts, time is virtual."""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import get_args

import optuna
import pytest
from optuna.trial import TrialState

from optuna_saturn.clock import VirtualClock
from optuna_saturn.planner import Cluster, WorkLimit
from optuna_saturn.pools.protocol import PoolBroken
from optuna_saturn.simulation.pool import Behaviour, Fault, SimulatedPool
from optuna_saturn.simulation.simulator import simulated_devices, simulated_strategies
from optuna_saturn.study.interrupts import Terminated, sigterm_as_keyboard_interrupt
from optuna_saturn.study.records import record
from optuna_saturn.sweep import effects
from optuna_saturn.sweep.assemble import assemble
from optuna_saturn.sweep.decisions import Decision, Release, Stop
from optuna_saturn.sweep.policy import Decisions, Ending, Policy, Round
from optuna_saturn.sweep.settings import SweepSettings


def test_every_kind_of_decision_has_exactly_one_handler():
    declared = effects.handlers()
    assert set(declared) == set(get_args(Decision))
    assert {kind.__name__: len(found) for kind, found in declared.items() if len(found) != 1} == {}


def test_the_effects_refuse_to_be_built_while_a_kind_of_decision_has_no_handler(monkeypatch):
    from optuna_saturn.sweep.effects import moves

    monkeypatch.setattr(moves, "HANDLERS", {k: h for k, h in moves.HANDLERS.items() if k is not Release})
    with pytest.raises(TypeError, match=r"exactly one handler.*'Release': 0"):
        effects.Effects(world=None)  # type: ignore[arg-type]  # (refused before the world is used)


class _Runtimes(dict):
    def __missing__(self, choice: tuple) -> float:
        return 100.0


class StopAtThirtySeconds(Policy):
    """A toy rule: every trial that has run 30 s is stopped. It only returns decisions; the loop carries them out."""

    def __init__(self) -> None:
        self.rounds = 0

    def on_round(self, round: Round) -> Decisions:
        self.rounds += 1
        return [
            Stop(run, "the toy rule stops it at 30 s")
            for run in round.state.trial_runs()
            if round.now - run.started >= 30.0 and not run.stalled
        ]


class CountsEnds(Policy):
    """A toy rule that only watches: the trials whose end it saw (the sweep's own rules then settle them)."""

    def __init__(self) -> None:
        self.ended: list[int] = []

    def on_end(self, ending: Ending) -> Decisions:
        self.ended.append(ending.run.number)
        return []


def _simulated_sweep(
    tmp_path: Path,
    more_policies: list[Policy],
    *,
    study_name: str | None = None,
    faults: Sequence[Fault] = (),
    max_retries: int = 0,
) -> optuna.Study:
    """Two trials of 100 s on one device, on the simulated pool, with the sweep's own policies and ``more_policies``
    (no price source: the trials are planned from runtime estimates)."""
    clock = VirtualClock()
    devices = simulated_devices(Cluster([1]))
    settings = SweepSettings(
        devices=devices,
        strategies=simulated_strategies(["single"]),
        solver="list",
        time_limit=2.0,
        log_dir=tmp_path,
        plan_work=WorkLimit(2.0),
        owned=False,
        max_retries=max_retries,
    )
    pool = SimulatedPool(devices, clock, lambda number: Behaviour(_Runtimes()), tick=5.0, faults=faults)
    storage = f"sqlite:///{tmp_path / 'study.db'}" if study_name else None
    study = optuna.create_study(study_name=study_name, storage=storage)
    sweep = assemble(
        settings,
        study,
        pool=pool,
        clock=clock,
        prices=None,
        n_trials=2,
        timeout=None,
        batch_size=1,
        more_policies=more_policies,
    )
    sweep.run()
    return study


def test_a_policy_added_to_the_list_is_called_each_round_and_its_decisions_are_carried_out(tmp_path):
    toy = StopAtThirtySeconds()
    study = _simulated_sweep(tmp_path, [toy])
    assert toy.rounds > 0
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.FAIL]
    assert all("the toy rule stops it at 30 s" in record(t, "fail_reason") for t in study.trials)
    # without it, the same sweep completes both trials
    plain = _simulated_sweep(tmp_path / "plain", [])
    assert [t.state for t in plain.trials] == [TrialState.COMPLETE, TrialState.COMPLETE]


def test_a_policy_added_to_the_list_sees_every_trials_end_before_it_is_settled(tmp_path):
    watcher = CountsEnds()
    study = _simulated_sweep(tmp_path, [watcher])
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.COMPLETE]
    assert sorted(watcher.ended) == [0, 1]


class TerminatedAtTheFirstEnd(Policy):
    """A toy rule that sends this process SIGTERM while the sweep handles a trial's end (as SLURM's time limit may
    land at any moment)."""

    def __init__(self) -> None:
        self.sent = False

    def on_end(self, ending: Ending) -> Decisions:
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)
        return []


def test_a_sigterm_while_a_trial_ends_waits_until_its_end_is_told(tmp_path):
    """The end the signal lands in is told whole, then the sweep stops: not cut between leaving the running set
    and being told (or between being told and its retry queued), which left it RUNNING for ever."""
    rule = TerminatedAtTheFirstEnd()
    with pytest.raises(Terminated), sigterm_as_keyboard_interrupt():
        _simulated_sweep(tmp_path, [rule], study_name="terminated")
    trials = optuna.load_study(study_name="terminated", storage=f"sqlite:///{tmp_path / 'study.db'}").trials
    assert rule.sent
    assert [t.state for t in trials] == [TrialState.COMPLETE]  # (one device: the next trial was not asked yet)


def test_a_pool_that_breaks_queues_its_running_trial_again(tmp_path):
    """Every node gone (SLURM ended the job the pool asked for at its time limit): the sweep ends, and the trial it
    was running waits in the queue again, for the next optimize, as under SIGTERM."""
    with pytest.raises(PoolBroken):
        _simulated_sweep(
            tmp_path, [], study_name="broken", faults=[Fault(50.0, "lose", "")], max_retries=1
        )  # (its one node)
    trials = optuna.load_study(study_name="broken", storage=f"sqlite:///{tmp_path / 'study.db'}").trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.WAITING]
    assert "the pool broke" in record(trials[0], "fail_reason")
    assert trials[1].user_attrs["saturn:retry_of"] == 0
