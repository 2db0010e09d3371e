"""The profiler: dry-run description, cache keys, analytic memory bound, and real profiling runs."""

from __future__ import annotations

import os
import threading

import objectives
import optuna
import pytest
import torch
from optuna.trial import TrialState

from optuna_saturn import SaturnExecutor
from optuna_saturn.events import SweepListener
from optuna_saturn.planner import Option
from optuna_saturn.pricing.floors import computes_plainly, no_better_than_linear_scaling
from optuna_saturn.pricing.prices import PricedOption
from optuna_saturn.profiler import ProfileRecord, ProfileStore, model_state_bytes, probe_workload, profile_key
from optuna_saturn.strategy import load_strategies


def _probe(params: dict):
    study = optuna.create_study()
    study.enqueue_trial(params)
    trial = study.ask()
    return probe_workload(objectives.profiled, trial, threading.Lock()), trial


def test_dry_run_describes_the_workload_without_allocating_and_fixes_the_params():
    workload, trial = _probe({"lr": 0.02})
    assert workload.total_steps == 40
    assert workload.n_params == sum(p.numel() for p in objectives.Blocks(width=32).parameters())
    assert workload.batch_signature == "[0]:(32, 8):torch.float32;[1]:(32, 1):torch.float32"  # a collated batch
    assert workload.global_batch == 32
    assert trial.params == {"lr": 0.02}  # decided once, in the executor's process


def _describe(objective):
    return probe_workload(objective, optuna.create_study().ask(), threading.Lock())


def test_description_keeps_the_objectives_own_tensors_real_so_its_caches_are_sound(tmp_path):
    """The README quickstart failed on a fresh machine: the whole objective ran under the meta device, so the
    example cached an empty meta tensor as its token file, and every later run loaded it. Only parameters go to
    the meta device now."""
    cache = tmp_path / "tokens.pt"
    seen = {}

    def objective(trial):
        if not cache.exists():
            torch.save(torch.arange(1000), cache)  # data prepared and cached inside the objective
        ids = torch.load(cache)
        model = torch.nn.Sequential(torch.nn.Embedding(50_000, 512), torch.nn.Linear(512, 50_000))
        seen["ids"], seen["param_device"] = ids.device, next(model.parameters()).device
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids.view(100, 10)), batch_size=4)
        model, loader = trial.prepare(model, loader)
        for _ in trial.steps(7):
            pass
        return 0.0

    workload = _describe(objective)
    assert torch.load(cache).sum().item() == sum(range(1000))  # real data on disk
    assert seen == {"ids": torch.device("cpu"), "param_device": torch.device("meta")}  # 51M parameters: none allocated
    assert workload.n_params == 50_000 * 512 * 2 + 50_000 and workload.total_steps == 7


def test_description_leaves_the_executors_global_state_as_it_was(tmp_path):
    def objective(trial):
        torch.manual_seed(123)
        torch.set_default_dtype(torch.float64)
        torch.set_num_threads(1)
        os.environ["SATURN_TEST_SET_BY_OBJECTIVE"] = "1"
        os.chdir(tmp_path)
        model = torch.nn.Linear(2, 1)
        loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(torch.zeros(8, 2)), batch_size=2, shuffle=True
        )
        model, loader = trial.prepare(model, loader)
        for _ in trial.steps(3):
            pass
        return 0.0

    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    threads, cwd = torch.get_num_threads(), os.getcwd()
    _describe(objective)
    assert torch.equal(torch.rand(3), expected)  # the shuffled batch drawn by the description left no trace
    assert torch.get_default_dtype() == torch.float32 and torch.get_num_threads() == threads
    assert "SATURN_TEST_SET_BY_OBJECTIVE" not in os.environ and os.getcwd() == cwd


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        for i in range(50):
            yield {"input_ids": torch.full((12,), i), "label": i}


def _truncating_collate(samples):
    return torch.stack([s[0][:6] for s in samples])  # the model sees 6 of each sample's 20 tokens


@pytest.mark.parametrize(
    ("make_loader", "signature"),
    [
        (
            lambda: torch.utils.data.DataLoader(_Stream(), batch_size=4),
            ".input_ids:(4, 12):torch.int64;.label:(4,):torch.int64",
        ),
        (
            lambda: torch.utils.data.DataLoader(
                torch.utils.data.TensorDataset(torch.zeros(40, 20)), batch_size=8, collate_fn=_truncating_collate
            ),
            ":(8, 6):torch.float32",
        ),
        (
            lambda: torch.utils.data.DataLoader(
                [{"ids": torch.zeros(16, dtype=torch.long)} for _ in range(9)], batch_size=3, shuffle=True
            ),
            ".ids:(3, 16):torch.int64",
        ),
    ],
    ids=["iterable-dataset-of-dicts", "collate-truncates", "dict-samples"],
)
def test_batch_signature_is_read_from_a_collated_batch(make_loader, signature):
    """The profile key must see the sequence length the model gets, wherever it is decided."""

    def objective(trial):
        _model, _loader = trial.prepare(torch.nn.Linear(2, 1), make_loader())
        for _ in trial.steps(5):
            pass
        return 0.0

    workload = _describe(objective)
    assert workload.batch_signature == signature
    assert workload.global_batch == int(signature.split("(")[1].split(",")[0].rstrip(")"))


def test_profile_key_changes_with_the_torch_and_deepspeed_versions(monkeypatch):
    from optuna_saturn.profiler import _store

    zero2, ddp = load_strategies()["zero2"], load_strategies()["ddp"]
    before = profile_key("m", "b", zero2, 2, "hw"), profile_key("m", "b", ddp, 2, "hw")
    real = _store._version
    monkeypatch.setattr(_store, "_version", lambda name: "9.9.9" if name == "deepspeed" else real(name))
    after = profile_key("m", "b", zero2, 2, "hw"), profile_key("m", "b", ddp, 2, "hw")
    assert after[0] != before[0] and after[1] == before[1]  # DeepSpeed's version matters to its strategies only
    monkeypatch.setattr(_store, "_version", lambda name: "0.0.1")
    assert profile_key("m", "b", ddp, 2, "hw") != before[1]


def test_learning_rate_does_not_change_the_profile_key_but_shape_does():
    (a, _), (b, _) = _probe({"lr": 0.02}), _probe({"lr": 0.035})
    ddp = load_strategies()["ddp"]
    assert profile_key(a.model_signature, a.batch_signature, ddp, 2, "hw") == profile_key(
        b.model_signature, b.batch_signature, ddp, 2, "hw"
    )
    keys = {
        profile_key(a.model_signature, a.batch_signature, ddp, 2, "hw"),
        profile_key(a.model_signature, a.batch_signature, ddp, 4, "hw"),
        profile_key(a.model_signature, a.batch_signature, load_strategies()["fsdp"], 2, "hw"),
        profile_key(a.model_signature, "batch=64", ddp, 2, "hw"),
        profile_key(a.model_signature, a.batch_signature, ddp, 2, "other-gpu"),
    }
    assert len(keys) == 5


def test_objective_that_cannot_be_dry_run_is_reported():
    def no_steps(trial):
        trial.suggest_float("x", 0, 1)
        return 0.0

    trial = optuna.create_study().ask()
    with pytest.raises(RuntimeError, match=r"trial.steps\(n\)"):
        probe_workload(no_steps, trial, threading.Lock())


def test_an_objective_that_takes_a_batch_before_its_loop_is_described():
    """Users read a first batch's shapes, or run a first forward pass, before training: that batch is the
    loader's real first one (on the model's meta device once moved to ``trial.device``), and the description goes
    on to the trial.steps() loop. Before, the description ended at that batch, and the trial was never profiled."""
    seen = {}

    def objective(trial):
        loader = torch.utils.data.DataLoader(objectives.regression_data(64), batch_size=16)
        model = torch.nn.Linear(8, 1)
        model, loader = trial.prepare(model, loader)
        x, _ = next(iter(loader))
        seen["shape"], seen["sum"] = tuple(x.shape), float(x.sum())
        seen["out"] = model(x.to(trial.device)).shape  # a first forward pass
        seen["evaluated"] = sum(1 for _ in loader)  # an evaluation pass before training: it ends
        for _ in trial.steps(12):
            x, _y = next(iter(loader))
        return 0.0

    workload = _describe(objective)
    first = next(iter(torch.utils.data.DataLoader(objectives.regression_data(64), batch_size=16)))[0]
    assert seen == {"shape": (16, 8), "sum": float(first.sum()), "out": (16, 1), "evaluated": 4}
    assert workload.total_steps == 12 and workload.global_batch == 16 and workload.n_params == 9


def test_an_objective_that_loops_over_its_loader_without_trial_steps_is_reported():
    def no_steps_loop(trial):
        loader = torch.utils.data.DataLoader(objectives.regression_data(64), batch_size=16)
        model, loader = trial.prepare(torch.nn.Linear(8, 1), loader)
        while True:  # (it would never end, were the batches not limited)
            for x, _y in loader:
                model(x.to(trial.device))

    with pytest.raises(RuntimeError, match=r"trial.steps\(n\).*it took 64 batches from its DataLoaders"):
        _describe(no_steps_loop)


def test_analytic_model_state_shrinks_as_each_strategy_shards():
    s = load_strategies()
    n = 1_000_000  # fp32: 4 MB of parameters, 4 MB of gradients
    assert model_state_bytes(n, 4, s["single"], 1) == model_state_bytes(n, 4, s["ddp"], 4) == 8e6
    assert model_state_bytes(n, 4, s["fsdp"], 4) == model_state_bytes(n, 4, s["zero3"], 4) == 2e6
    assert model_state_bytes(n, 4, s["zero1"], 4) == 8e6 and model_state_bytes(n, 4, s["zero2"], 4) == 5e6
    assert model_state_bytes(n, 4, s["fsdp-offload"], 2) == model_state_bytes(n, 4, s["zero3-offload"], 2) == 0


def test_store_round_trip_and_whole_trial_runtime(tmp_path):
    store = ProfileStore(tmp_path)
    record = ProfileRecord(
        key="k",
        strategy="ddp",
        devices=2,
        hardware="hw",
        feasible=True,
        step_seconds=0.05,
        startup_seconds=4.0,
        peak_memory_bytes=1,
        timed_steps=5,
    )
    store.put(record)
    assert store.get("k") == record and len(store) == 1 and store.get("missing") is None
    assert record.whole_trial_seconds(100) == pytest.approx(9.0)
    (tmp_path / "bad.json").write_text("{")
    assert store.get("bad") is None


class _ProfileEvents(SweepListener):
    def __init__(self) -> None:
        self.events = []

    def on_profile(self, study, event):
        self.events.append(event)


def _run_dir_logs(tmp_path, prefix: str) -> list:
    return sorted(p.name for p in (tmp_path / "runs").rglob(f"{prefix}*.log"))


def _priced_by(trial) -> str:
    return trial.system_attrs["saturn:priced_by"]


@pytest.mark.launch
def test_real_runs_are_the_profiles_of_trials_and_sweeps_that_vary_only_the_learning_rate(saturn_options, tmp_path):
    """No separate profiling when it would not pay: the first trial of a workload runs at once, its steps become
    its option's profile, and every later trial of that workload (this sweep or the next) is priced by it. (With
    single alone on one device nothing would be priced: every trial has the one option.)"""
    store = saturn_options["profile_store"]
    executor = SaturnExecutor(devices=1, strategies=["single", "single-ckpt"], **saturn_options)
    first = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    executor.optimize(first, objectives.profiled, n_trials=3)
    assert all(t.state == TrialState.COMPLETE for t in first.trials)
    assert _priced_by(first.trials[0]) != "measured" and _priced_by(first.trials[2]) == "measured"
    assert first.user_attrs["saturn:last_sweep"]["profiling_runs"] == 0
    assert _run_dir_logs(tmp_path, "profile-") == []
    (record,) = [r for r in ProfileStore(store).records() if r.strategy == "single"]
    assert record.feasible and record.observed_runs >= 2
    assert record.observed_step_seconds > 0 and record.timed_steps == 40 and record.work_flops > 0
    learned = record.whole_trial_seconds(40)  # what the first sweep's real runs say a whole trial takes

    second = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    executor.optimize(second, objectives.profiled, n_trials=2)
    assert {t.params["lr"] for t in second.trials}.isdisjoint({t.params["lr"] for t in first.trials})
    assert all(t.state == TrialState.COMPLETE and _priced_by(t) == "measured" for t in second.trials)
    (option,) = [o for o in second.trials[0].system_attrs["saturn:options"] if o["strategy"] == "single"]
    assert option["runtime"] == pytest.approx(learned, abs=2e-3)


@pytest.mark.launch
def test_one_profiling_job_times_several_strategies_and_trials(saturn_options, tmp_path):
    """``executor.profile`` measures every option: one job per device count times every strategy (least memory
    first) of every trial (two widths: two workloads) in turn, on warm workers."""
    executor = SaturnExecutor(devices=2, strategies=["single", "single-ckpt", "ddp", "fsdp"], **saturn_options)
    study = executor.profile(objectives.two_widths, n_trials=6, seed=0)  # widths 32, 16, 32, 32, 16, 16
    widths = {t.number: t.params["width"] for t in study.trials}
    assert set(widths.values()) == {16, 32}
    jobs = _run_dir_logs(tmp_path, "profile-")
    assert len(jobs) == 2 and all(("fsdp+ddpx2" in j) != ("single+single-ckptx1" in j) for j in jobs)
    for trial in study.trials:
        profiles = {(p["strategy"], p["devices"]): p for p in trial.system_attrs["saturn:profiles"]}
        assert set(profiles) == {("single", 1), ("single-ckpt", 1), ("ddp", 2), ("fsdp", 2)}
        assert all(p["feasible"] and p["step_seconds"] > 0 for p in profiles.values())
    assert all(j.startswith("profile-0,1-") for j in jobs)  # trials 0 and 1 (one per workload) in one pass
    assert len(ProfileStore(saturn_options["profile_store"])) == 8  # 2 workloads x 4 options, measured once


@pytest.mark.launch
def test_threads_is_profiled_in_a_job_of_its_own(saturn_options, tmp_path):
    """One process on both devices' cores runs without the process group of the others' ranks, so it never
    shares a profiling job with DDP of the same device count; it is measured like any option."""
    executor = SaturnExecutor(devices=2, strategies=["single", "ddp", "threads"], **saturn_options)
    study = executor.profile(objectives.two_widths, n_trials=2, seed=0)
    jobs = _run_dir_logs(tmp_path, "profile-")
    assert sorted(j.split("-", 2)[2].rsplit(".", 1)[0] for j in jobs) == ["ddpx2", "singlex1", "threadsx2"], jobs
    for trial in study.trials:
        profiles = {(p["strategy"], p["devices"]): p for p in trial.system_attrs["saturn:profiles"]}
        assert profiles[("threads", 2)]["feasible"] and profiles[("threads", 2)]["step_seconds"] > 0


@pytest.mark.launch
def test_out_of_memory_in_profiling_marks_the_option_infeasible(saturn_options, tmp_path):
    executor = SaturnExecutor(devices=2, strategies=["single", "single-ckpt", "ddp"], **saturn_options)
    study = executor.profile(objectives.single_does_not_fit, n_trials=1)
    profiles = {(p["strategy"], p["devices"]): p for p in study.trials[0].system_attrs["saturn:profiles"]}
    assert profiles[("single", 1)]["feasible"] is False and profiles[("single-ckpt", 1)]["feasible"] is False
    assert profiles[("ddp", 2)]["feasible"] is True
    # single ran out of memory first; the job stopped and single-ckpt got a job of its own
    assert len(_run_dir_logs(tmp_path, "profile-")) == 3

    real = optuna.create_study()
    executor.optimize(real, objectives.single_does_not_fit, n_trials=1)
    assert real.trials[0].state == TrialState.COMPLETE and real.trials[0].system_attrs["saturn:strategy"] == "ddp"
    assert [o["strategy"] for o in real.trials[0].system_attrs["saturn:options"]] == ["ddp"]


@pytest.mark.launch
def test_a_real_run_out_of_memory_plans_the_trial_again_with_more_micro_batches(saturn_options, tmp_path):
    """A batch of 32 that only fits as micro-batches of 8 rows, on one device: the trial runs out of memory with
    1 and 2 micro-batches, is planned again each time, and completes with 4; the next sweep knows."""
    executor = SaturnExecutor(devices=1, strategies=["single"], **saturn_options)
    study = optuna.create_study()
    executor.optimize(study, objectives.needs_small_micro_batches, n_trials=1)

    trial = study.trials[0]
    assert trial.state == TrialState.COMPLETE, trial.system_attrs.get("saturn:fail_reason")
    assert trial.system_attrs["saturn:gradient_accumulation"] == trial.user_attrs["gradient_accumulation_seen"] == 4
    tried = {
        (p["strategy"], p.get("gradient_accumulation", 1)): p["feasible"] for p in trial.system_attrs["saturn:profiles"]
    }
    assert tried == {("single", 1): False, ("single", 2): False}  # as priced for its last run
    records = {r.gradient_accumulation: r.feasible for r in ProfileStore(saturn_options["profile_store"]).records()}
    assert records == {1: False, 2: False, 4: True}  # the last run is the profile of 4 micro-batches

    again = optuna.create_study()
    executor.optimize(again, objectives.needs_small_micro_batches, n_trials=1)
    attrs = again.trials[0].system_attrs
    assert again.trials[0].state == TrialState.COMPLETE and attrs["saturn:gradient_accumulation"] == 4
    assert [o.get("gradient_accumulation", 1) for o in attrs["saturn:options"]] == [4]  # planned right away


@pytest.mark.launch
def test_the_objective_after_its_loop_is_timed_even_when_it_expects_the_whole_loop(saturn_options):
    """The final evaluation is part of the trial's runtime; a profile's short loop must not lose the steps."""
    study = SaturnExecutor(devices=1, strategies=["single"], **saturn_options).profile(
        objectives.evaluates_after_training, n_trials=1
    )
    (profile,) = study.trials[0].system_attrs["saturn:profiles"]
    # (its steps sleep 0.01 s and its evaluation 0.5 s: each lower bound shows the part was timed where it belongs;
    # the upper bounds are loose, as a loaded 2-core machine stretches both)
    assert profile["feasible"] and 0.01 <= profile["step_seconds"] < 0.5
    assert 0.5 <= profile["tail_seconds"] < 5.0
    assert profile["exit_seconds"] == 0.0  # a warm worker does not exit


@pytest.mark.launch
def test_nested_epoch_loops_are_priced_as_the_whole_trial(saturn_options):
    """``for epoch in range(6): for s in trial.steps(len(loader))``: a profiling job counts every epoch's loop
    and times the evaluation between epochs; a real run reports every loop. Priced as its first epoch alone,
    the trial was 1/6 of its length."""
    executor = SaturnExecutor(devices=1, strategies=["single", "single-ckpt"], **saturn_options)  # (to price)
    profiles = executor.profile(objectives.epochs_with_evaluation, n_trials=1).trials[0].system_attrs["saturn:profiles"]
    (profile,) = [p for p in profiles if p["strategy"] == "single"]
    assert profile["loops"] == 6 and 0.25 < profile["between_seconds"] < 3.0  # (0.3 s of evaluation between)
    study = optuna.create_study()
    executor.optimize(study, objectives.epochs_with_evaluation, n_trials=2)
    for trial in study.trials:
        assert trial.state == TrialState.COMPLETE, trial.system_attrs.get("saturn:fail_reason")
        assert sorted(trial.intermediate_values) == list(range(6))
        predicted, actual = trial.system_attrs["saturn:planned_runtime"], trial.system_attrs["saturn:actual_runtime"]
        print(f"nested epochs, trial {trial.number}: predicted {predicted:.2f} s, actual {actual:.2f} s")
        assert 0.75 * actual < predicted < 1.33 * actual


@pytest.mark.launch
def test_a_crashed_profile_never_reaches_the_planner_and_spares_its_job_mates(saturn_options, tmp_path):
    executor = SaturnExecutor(devices=2, strategies=["ddp", "fsdp"], **saturn_options)
    study = executor.profile(objectives.crashes_under_fsdp, n_trials=2)
    for trial in study.trials:
        profiles = {p["strategy"]: p for p in trial.system_attrs["saturn:profiles"]}
        assert profiles["fsdp"]["failed"] and "simulated crash under fsdp" in profiles["fsdp"]["error"]
        assert profiles["ddp"]["feasible"] and profiles["ddp"]["step_seconds"] > 0
    # fsdp went first (least memory) and crashed; ddp was measured in a job of its own, once for both trials
    # (their workloads share a key, and so does the failure)
    assert _run_dir_logs(tmp_path, "profile-") == ["profile-0-ddpx2.log", "profile-0-fsdp+ddpx2.log"]


@pytest.mark.launch
def test_a_real_run_that_crashes_at_once_under_a_new_option_is_planned_on_another(saturn_options):
    """A strategy is our choice: when a trial crashes before its first step under an option nobody ran for its
    workload, the option is left out and the trial runs again on another one."""
    study = optuna.create_study()
    SaturnExecutor(devices=2, strategies=["fsdp", "ddp"], **saturn_options).optimize(
        study, objectives.crashes_under_fsdp, n_trials=2
    )
    for trial in study.trials:
        assert trial.state == TrialState.COMPLETE, trial.system_attrs.get("saturn:fail_reason")
        assert trial.system_attrs["saturn:strategy"] == "ddp"


def test_observed_step_rate_corrects_only_the_training_loop():
    from optuna_saturn.pricing.unprofiled import RuntimeEstimator

    estimator = RuntimeEstimator(load_strategies().values(), 2)
    assert estimator.corrected(100.0, loop_seconds=60.0) == 100.0  # nothing observed yet
    for profiled, actual in ((0.10, 0.12), (0.20, 0.24), (0.10, 0.30)):
        estimator.observe_step_rate(profiled, actual)
    # median ratio 1.2: 60 s of loop become 72 s; the 40 s of start-up and final evaluation stay
    assert estimator.corrected(100.0, loop_seconds=60.0) == pytest.approx(112.0)


def test_cpu_peak_memory_is_per_strategy_not_cumulative():
    """One launch times several strategies: each one's peak is what it added, not an earlier one's, nor the
    libraries the worker holds."""
    import torch

    from optuna_saturn.worker.memory import RunMemory, release_memory

    cpu = torch.device("cpu")
    first = RunMemory(cpu)
    big = torch.ones(64 * 2**20)  # 64 Mi float32 = 256 MiB, touched
    assert 200 * 2**20 <= first.peak() < 400 * 2**20
    del big
    release_memory(cpu)
    assert RunMemory(cpu).peak() < 100 * 2**20


def test_a_predicted_option_is_never_faster_than_linear_scaling_of_a_measured_plain_one():
    strategies = load_strategies()

    def measured(strategy: str, devices: int, runtime: float) -> PricedOption:
        record = ProfileRecord(
            key=strategy,
            strategy=strategy,
            devices=devices,
            hardware="hw",
            feasible=True,
            step_seconds=0.1,
            startup_seconds=0.0,
            peak_memory_bytes=1,
            timed_steps=5,
        )
        return PricedOption(Option(strategy, devices, runtime), strategy, record)

    def predicted(strategy: str, devices: int, runtime: float) -> PricedOption:
        return PricedOption(Option(strategy, devices, runtime), strategy, None, 0.3, "scaled")

    single, ckpt = measured("single", 1, 10.0), measured("single-ckpt", 1, 13.0)
    ddp, slow_zero = predicted("ddp", 2, 3.9), predicted("zero3-offload", 2, 8.0)
    floored = {p.option.strategy: p for p in no_better_than_linear_scaling([single, ckpt, ddp, slow_zero], strategies)}
    assert floored["ddp"].option.runtime == pytest.approx(5.0) and floored["ddp"].basis == "scaled, floored"
    assert floored["zero3-offload"] == slow_zero and floored["single"] == single and floored["single-ckpt"] == ckpt
    # Recomputation and offload trade speed for memory: a measurement of them bounds nothing.
    assert no_better_than_linear_scaling([ckpt, ddp], strategies) == [ckpt, ddp]
    assert not computes_plainly(strategies["zero3-offload"]) and not computes_plainly(strategies["fsdp-offload"])
    assert computes_plainly(strategies["zero3"]) and computes_plainly(strategies["ddp"])


def test_after_two_descriptions_past_their_limit_no_trial_is_described_again(caplog):
    """A description past describe_timeout costs the sweep its wait (it waits for each): an objective whose set-up
    always takes longer (a plain one whose whole body does) would cost it at every trial. After two, the later
    trials are planned from estimates without one (a review of the describe limit)."""
    from types import SimpleNamespace

    from optuna_saturn.pricing.descriptions import TIMEOUTS_BEFORE_ESTIMATES, Descriptions
    from optuna_saturn.profiler import DescribeTimedOut

    described: list[int] = []

    def too_slow(trial):
        described.append(trial.number)
        raise DescribeTimedOut("its objective did not reach its first trial.steps() loop within describe_timeout")

    descriptions = Descriptions(too_slow)
    with caplog.at_level("WARNING", logger="optuna.saturn.profiler"):
        assert [descriptions.of(SimpleNamespace(number=n)) for n in range(4)] == [None] * 4
    assert described == list(range(TIMEOUTS_BEFORE_ESTIMATES)) == [0, 1]
    assert descriptions.failure(0) is None  # (planned from estimates: it runs, not a failure)
    assert "later trials are not described either" in caplog.text
