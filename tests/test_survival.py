"""Pricing for the pruner: a trial is priced at the share of its steps that the sweep's finished trials say it
will run, following the pruner's own rules, and pruning-blind planning prices it whole."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState
from test_scheduler import job, runs, single, study_of

from optuna_saturn.planner import Cluster, Option
from optuna_saturn.pricing.survival import PRIOR_TRIALS, Survival
from optuna_saturn.simulation.known_prices import JOB_PARAMETER
from optuna_saturn.simulation.simulator import run_simulation
from optuna_saturn.sweep.weighing import most_efficient


def test_no_pruner_or_blind_planning_prices_every_trial_whole():
    for survival in (Survival(None), Survival(optuna.pruners.NopPruner())):
        survival.saw(0.1, complete=False)
        assert survival.expected_share() == 1.0 and survival.blind


def test_nothing_is_shorter_before_the_pruner_may_prune():
    survival = Survival(optuna.pruners.MedianPruner(n_startup_trials=2))
    survival.saw(0.1, complete=False)
    survival.saw(1.0, complete=True)
    assert survival.expected_share() == 1.0  # one trial complete: the median pruner prunes nothing yet
    assert "prunes nothing before 2 trials complete (1 have)" in survival.describe()
    survival.saw(1.0, complete=True)
    assert survival.expected_share() < 1.0


def test_the_expected_share_follows_the_history_held_towards_the_whole_and_is_conditional_on_progress():
    survival = Survival(optuna.pruners.MedianPruner(n_startup_trials=0))
    for share in [0.1] * 6 + [0.3] * 2:
        survival.saw(share, complete=False)
    for _ in range(4):
        survival.saw(1.0, complete=True)
    whole = 6 * 0.1 + 2 * 0.3 + 4 * 1.0 + PRIOR_TRIALS
    assert survival.expected_share() == pytest.approx(whole / (12 + PRIOR_TRIALS))
    # past the first rung, the trials pruned there no longer count; past the last, it is expected to finish
    assert survival.expected_share(0.2) == pytest.approx((2 * 0.1 + 4 * 0.8 + PRIOR_TRIALS * 0.8) / 9 / 0.8)
    assert survival.expected_share(0.5) == pytest.approx(1.0)
    assert "12 finished trials under the MedianPruner, 8 pruned" in survival.describe()


def test_it_is_learned_from_the_studys_finished_trials():
    study = optuna.create_study(pruner=optuna.pruners.MedianPruner(n_startup_trials=0))
    for steps in ([2, 20], [20, 20], None):
        trial = study.ask()
        if steps is None:
            study.tell(trial, state=TrialState.PRUNED)  # (no saturn:steps: a plain study.optimize's, unknown)
            continue
        trial.set_user_attr("saturn:steps", steps)
        study.tell(trial, 1.0) if steps[0] == steps[1] else study.tell(trial, state=TrialState.PRUNED)
    survival = Survival.of_study(study)
    assert survival.expected_share() == pytest.approx((0.1 + 1.0 + PRIOR_TRIALS) / (2 + PRIOR_TRIALS))
    assert Survival.of_study(study, blind=True).expected_share() == 1.0


@pytest.mark.parametrize("plan_for_pruning", [True, False])
def test_a_trial_is_planned_at_what_the_pruned_trials_before_it_say_it_will_run(plan_for_pruning):
    """One device, trials one after another: one completes, three are pruned at a tenth of their steps; the last
    is planned at its expected runtime (its full length when planning is pruning-blind), and says so."""
    jobs = [single("c0", 10.0), *(single(f"p{i}", 100.0, prune_at=0.1) for i in range(3)), single("z", 100.0)]
    study = study_of(jobs)
    study.pruner = optuna.pruners.MedianPruner(n_startup_trials=1)
    run_simulation(jobs, Cluster([1]), mode="replan", study=study, plan_for_pruning=plan_for_pruning, known_ahead=False)
    last = study.trials[-1]
    expected = (1.0 + 3 * 0.1 + PRIOR_TRIALS) / (4 + PRIOR_TRIALS)
    assert last.state == TrialState.COMPLETE
    if plan_for_pruning:
        assert last.system_attrs["saturn:planned_runtime"] == pytest.approx(100.0 * expected, rel=0.02)
        assert (
            "priced at 61% of their steps: 4 finished trials under the MedianPruner, 3 pruned"
            in last.system_attrs["saturn:pruning_assumed"]
        )
    else:
        assert last.system_attrs["saturn:planned_runtime"] == pytest.approx(100.0, rel=0.02)
        assert "saturn:pruning_assumed" not in last.system_attrs


def _pruned_mostly_at_a_tenth(*, to_next_rung: bool) -> Survival:
    survival = Survival(optuna.pruners.MedianPruner(n_startup_trials=0), to_next_rung=to_next_rung)
    for share in [0.1] * 9 + [0.102] + [0.3] * 2:  # (0.1 and 0.102: one rung, steps rounded differently)
        survival.saw(share, complete=False)
    for _ in range(2):
        survival.saw(1.0, complete=True)
    return survival


def test_the_rungs_and_the_chance_of_going_past_the_next_one_are_learned_from_where_trials_were_pruned():
    survival = _pruned_mostly_at_a_tenth(to_next_rung=True)
    assert survival.next_rung() == pytest.approx(0.1)
    assert survival.chance_past_next_rung() == pytest.approx((2 + 2 + PRIOR_TRIALS) / (14 + PRIOR_TRIALS))
    assert survival.likely_stopped()
    assert "planned to their next rung, 10% of their steps, which 41% go past" in survival.describe()
    # just before the rung, it is still ahead
    assert survival.next_rung(0.09) == pytest.approx(0.1) and survival.likely_stopped(0.09)
    # on it (the trials pruned at 0.102 were pruned there too), the next is the second, which most of the trials
    # that got there went past
    assert survival.next_rung(0.1) == pytest.approx(0.3)
    assert survival.chance_past_next_rung(0.1) == pytest.approx((2 + PRIOR_TRIALS) / (4 + PRIOR_TRIALS))
    assert not survival.likely_stopped(0.1)
    assert survival.next_rung(0.5) is None and not survival.likely_stopped(0.5)
    assert Survival(None).next_rung() is None and not Survival(None, to_next_rung=True).likely_stopped()
    # planned for the pruner but not to the next rung: no trial is held back
    survival = _pruned_mostly_at_a_tenth(to_next_rung=False)
    assert not survival.likely_stopped() and "rung" not in survival.describe()


def test_a_prune_at_the_last_report_is_no_rung_and_completed_trials_went_past_every_rung():
    survival = Survival(optuna.pruners.MedianPruner(n_startup_trials=0), to_next_rung=True)
    for share in [0.1] * 5 + [1.0]:
        survival.saw(share, complete=False)
    for _ in range(10):
        survival.saw(1.0, complete=True)
    assert survival.next_rung(0.2) is None and not survival.likely_stopped(0.2)
    assert survival.chance_past_next_rung() == pytest.approx((10 + 1 + PRIOR_TRIALS) / (16 + PRIOR_TRIALS))


def test_a_trial_held_to_its_most_efficient_options_keeps_one_that_fits_a_node():
    options = [Option("single", 1, 100.0), Option("ddp", 2, 45.0), Option("ddp", 4, 40.0)]
    assert {o.devices for o in most_efficient(options, 4)} == {2}
    # with nodes of one device left, ddp x2 does not fit: the most efficient option that fits is the measure
    assert {o.devices for o in most_efficient(options, 1)} == {1, 2}


@pytest.mark.parametrize("to_next_rung", [True, False])
def test_a_trial_likely_pruned_at_its_next_rung_starts_on_its_most_efficient_option_and_grows_once_past_it(
    to_next_rung,
):
    """Two devices; the study's history: six trials pruned at a tenth of their steps, one complete. Then one trial,
    100 s on one device or 60 s on both: priced for the pruner it takes both (the plan ends sooner); planned to the
    next rung it is more likely pruned there than not, so it starts on one, and once past the rung it has both
    options again and grows onto the idle device at its next checkpoint."""
    study = optuna.create_study(pruner=optuna.pruners.MedianPruner(n_startup_trials=0))
    for steps in [[10, 100]] * 6 + [[100, 100]]:
        trial = study.ask()
        trial.set_user_attr("saturn:steps", steps)
        study.tell(trial, 1.0) if steps[0] == steps[1] else study.tell(trial, state=TrialState.PRUNED)
    study.enqueue_trial({JOB_PARAMETER: 0})
    jobs = [job("z", ("single", 1, 100.0), ("ddp", 2, 60.0), checkpoint_every=10)]
    result = run_simulation(
        jobs,
        Cluster([2]),
        mode="replan",
        study=study,
        elastic=True,
        plan_for_pruning=True,
        plan_to_next_rung=to_next_rung,
        solver="list",
    )
    placed = sorted(runs(result)["z"], key=lambda a: a.start)
    assert study.trials[-1].state == TrialState.COMPLETE
    assumed = study.trials[-1].system_attrs["saturn:pruning_assumed"]
    if to_next_rung:
        assert "planned to their next rung, 10% of their steps, which 40% go past, on their most efficient" in assumed
        assert [a.option.devices for a in placed] == [1, 2]
        # weighed at its first checkpoint, on the rung (step 10): it may move, and it does at its next one
        assert placed[0].end == pytest.approx(20.0)
    else:
        assert "rung" not in assumed
        assert [a.option.devices for a in placed] == [2]
