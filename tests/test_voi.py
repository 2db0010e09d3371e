"""The value-of-information rule: measure an option only when what it may show could shorten the plan by more
than the measurement costs."""

from __future__ import annotations

from optuna_saturn.planner import Cluster, Job, Option, solve
from optuna_saturn.pricing.prices import PricedOption
from optuna_saturn.pricing.value_of_information import profile_gain, worth_measuring
from optuna_saturn.profiler import ProfileRecord
from optuna_saturn.sweep.weighing import weighed

CLUSTER = Cluster([2])


def test_a_profile_that_cannot_change_the_plan_is_skipped():
    """Eight trials of 10 s on one device keep both devices busy: a two-device option, even at its most
    hopeful 4 s, would not end the sweep sooner, so measuring it is worth nothing."""
    jobs = [Job(str(i), [Option("single", 1, 10.0), Option("ddp", 2, 8.0)]) for i in range(8)]
    gain = profile_gain(jobs, CLUSTER, "0", ("ddp", 2, 1), optimistic_runtime=5.0)
    assert gain == 0.0
    assert not worth_measuring(gain, measurement_seconds=1.0, devices=2, cluster=CLUSTER)


def test_a_profile_that_can_change_the_plan_is_run():
    """One long trial left: if its two-device option is as fast as hoped, the sweep ends 8 s sooner; measuring
    it costs 2 s on both devices: worth it. At 30 s of measurement it is not."""
    jobs = [Job("0", [Option("single", 1, 20.0), Option("ddp", 2, 14.0)])]
    gain = profile_gain(jobs, CLUSTER, "0", ("ddp", 2, 1), optimistic_runtime=12.0)
    assert gain == 8.0
    assert worth_measuring(gain, measurement_seconds=2.0, devices=2, cluster=CLUSTER)
    assert not worth_measuring(gain, measurement_seconds=30.0, devices=2, cluster=CLUSTER)


def test_an_only_option_is_not_profiled_separately():
    """With nothing to choose between, the trial's first real run measures its option anyway."""
    jobs = [Job("0", [Option("single", 1, 20.0)])]
    assert profile_gain(jobs, CLUSTER, "0", ("single", 1, 1), optimistic_runtime=1.0) == 0.0


def test_an_unmeasured_option_wins_only_by_more_than_its_uncertainty():
    """A warm sweep's four trials: single measured on each, ddp x2 predicted by the prior (uncertainty 0.6) at a
    little more than half. Taken at face value the plan runs all four on both devices (ddp really took 1.35x the
    device-seconds, and the sweep lost 25%); weighed by their uncertainty, the measured option stays."""
    record = ProfileRecord(
        key="k",
        strategy="single",
        devices=1,
        hardware="hw",
        feasible=True,
        step_seconds=0.1,
        startup_seconds=0.0,
        peak_memory_bytes=1,
        timed_steps=5,
    )
    trials = []
    for single, ddp in [(8.3, 4.42), (6.0, 3.15), (4.9, 2.3), (3.2, 1.48)]:
        trials.append(
            [
                PricedOption(Option("single", 1, single), "s", record),
                PricedOption(Option("ddp", 2, ddp), "d", None, 0.6, "prior"),
            ]
        )

    def chosen(weigh: bool) -> set[str]:
        jobs = [
            Job(str(i), weighed([p.option for p in priced], priced) if weigh else [p.option for p in priced])
            for i, priced in enumerate(trials)
        ]
        return {a.option.strategy for a in solve(jobs, Cluster([2]), "cpsat", 2.0).assignments}

    assert "ddp" in chosen(weigh=False)
    assert chosen(weigh=True) == {"single"}
    measured_again = [PricedOption(Option("ddp", 2, 4.42), "d", record)]
    assert weighed([measured_again[0].option], measured_again)[0].runtime == 4.42  # measured: taken as it is
