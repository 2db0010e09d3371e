"""The trial an objective gets offers every public member of ``optuna.Trial`` for the installed Optuna, and each
does what Optuna's does: suggestions and constraints land on the real trial, reads answer on one rank alone.
A new Optuna release that adds a member fails the first test, naming it."""

from __future__ import annotations

import optuna
import pytest
from member_objectives import ends_itself, every_member
from optuna.trial import TrialState

from optuna_saturn import SaturnExecutor, SaturnTrial
from optuna_saturn.profiler._stand_in import StandInTrial


def _public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


@pytest.mark.parametrize("ours", [SaturnTrial, StandInTrial], ids=["worker", "describing"])
def test_every_public_member_of_optuna_trial_is_offered(ours):
    probe = StandInTrial(optuna.create_study().ask(), __import__("threading").Lock())
    offered = _public(ours) | (set(vars(probe)) if ours is StandInTrial else set())
    missing = sorted(_public(optuna.Trial) - offered)
    assert not missing, f"optuna.Trial members the objective's trial lacks: {missing}"


@pytest.mark.launch
@pytest.mark.parametrize("devices,strategies", [(1, ["single"]), (2, ["ddp"])], ids=["single", "ddp"])
def test_every_member_works_as_optunas_own(saturn_options, devices, strategies):
    study = optuna.create_study(study_name="members")
    study.set_user_attr("team", "vision")
    study.enqueue_trial({"lr": 0.01, "width": 8, "act": "tanh", "u": 0.75, "lu": 0.01, "du": 0.5})
    SaturnExecutor(devices=devices, strategies=strategies, **saturn_options).optimize(study, every_member, n_trials=1)
    (frozen,) = study.trials
    assert frozen.state == TrialState.COMPLETE, frozen.system_attrs.get("saturn:fail_reason")
    seen = frozen.user_attrs["seen"]
    assert seen["number"] == frozen.number
    assert seen["params"] == frozen.params
    assert seen["distributions"] == {k: repr(v) for k, v in frozen.distributions.items()}
    assert frozen.constraints == {"c0": 0.25} and seen["constraints"] == {"c0": 0.25}
    assert frozen.user_attrs["mine"] == {"width": 8} == seen["mine"]
    assert not [key for key in seen["user_attrs"] if key.startswith("saturn:")]  # (the sweep's records are no user's)
    assert seen["datetime_start"] == frozen.datetime_start.isoformat()
    assert seen["relative_params"] == {}
    assert (seen["study_name"], seen["direction"]) == ("members", "MINIMIZE")
    assert seen["study_user_attrs"]["team"] == "vision"
    assert "callback" in seen["study_trials_error"] and "study_name" in seen["study_trials_error"]


@pytest.mark.launch
@pytest.mark.parametrize("how, raised", [(1, KeyboardInterrupt), (2, SystemExit)])
def test_keyboard_interrupt_or_exit_in_the_objective_is_raised_as_study_optimize_raises_it(saturn_options, how, raised):
    """Raised in a worker, never in the user's process: its trial ends FAIL with the reason, no trial starts after
    it, and ``optimize`` raises it, as ``study.optimize`` does (docs/failures.md)."""
    study = optuna.create_study()
    for one in (how, 0):
        study.enqueue_trial({"how": one})
    with pytest.raises(raised):
        SaturnExecutor(devices=1, strategies=["single"], **saturn_options).optimize(study, ends_itself, n_trials=2)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.WAITING]  # (the other stays queued)
    assert raised.__name__ in study.trials[0].system_attrs["saturn:fail_reason"]


def test_a_snapshot_of_a_queued_trial_or_of_attributes_json_cannot_keep_never_fails():
    """A profiling run may measure a queued trial not taken yet (a FixedTrial: no study, no trial id), and an
    in-memory study keeps attributes of any type: either used to raise out of the pool's submit."""
    import pathlib

    from optuna_saturn.study.queue import QueuedTrial
    from optuna_saturn.study.trial_snapshot import trial_snapshot

    study = optuna.create_study(study_name="snap")
    study.set_user_attr("where", pathlib.Path("/data"))
    study.enqueue_trial({"lr": 0.1})
    queued = QueuedTrial(study.get_trials(deepcopy=False)[0])
    snapshot = trial_snapshot(queued, study)
    assert snapshot["study"]["study_name"] == "snap" and snapshot["study"]["user_attrs"]["where"].endswith("'/data')")
    asked = study.ask()
    asked.set_user_attr("array", __import__("numpy").zeros(3))
    assert trial_snapshot(asked)["user_attrs"]["array"].startswith("array(")
    assert trial_snapshot(asked)["relative_params"] == {}  # (read without making the sampler sample)
