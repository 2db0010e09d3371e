"""Every shipped strategy is what it says, on CPU too (DESIGN decision 3), and trains like ``single``."""

from __future__ import annotations

import os

import objectives
import optuna
import pytest
from optuna.trial import TrialState

from optuna_saturn import SaturnExecutor
from optuna_saturn.strategy import load_strategies

pytestmark = pytest.mark.launch

#: Float32 on CPU; sharded reductions sum in a different order than one process does.
LOSS_TOLERANCE = 1e-4


#: Shipped strategies forced to accumulate gradients (a user folder may do this; the planner otherwise
#: accumulates only where the whole batch runs out of memory): name -> (base strategy, micro-batches).
ACCUMULATING = {
    "single-accum4": ("single", 4),
    "ddp-accum2": ("ddp", 2),
    "fsdp-accum2": ("fsdp", 2),
    "zero2-accum2": ("zero2", 2),
    "zero3-accum2": ("zero3", 2),
}


def _accumulating_folder(folder):
    shipped = load_strategies()
    for name, (base, micro_batches) in ACCUMULATING.items():
        template = shipped[base].to_json()
        text = (
            f'name = "{name}"\nlauncher = "{template["launcher"]}"\nengine = "{template["engine"]}"\n'
            f"min_devices = {template['min_devices']}\n"
            + (f"max_devices = {template['max_devices']}\n" if template["max_devices"] else "")
            + f"[knobs]\ngradient_accumulation = [{micro_batches}]\n"
        )
        stage = template["launcher_config"].get("zero_optimization", {}).get("stage")
        if stage is not None:
            text += f"[launcher_config.zero_optimization]\nstage = {stage}\n"
        (folder / f"{name}.toml").write_text(text)
    return folder


#: Every strategy whose loss curve is compared with single's (on 2 devices; single-ckpt on 1).
AGAINST_SINGLE = [
    "single-ckpt",
    "threads",
    "ddp",
    "fsdp",
    "fsdp-ckpt",
    "fsdp-offload",
    "zero1",
    "zero2",
    "zero3",
    "zero3-offload",
    *ACCUMULATING,
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One sweep runs every strategy on the same objective (single strategies on 1 device, the rest on 2)."""
    tmp = tmp_path_factory.mktemp("strategies")
    folder = _accumulating_folder(tmp_path_factory.mktemp("accumulating"))
    results = {}
    names = ["single", *AGAINST_SINGLE]
    for name in names:
        study = optuna.create_study()
        devices = 1 if name.startswith("single") else 2
        SaturnExecutor(
            devices=devices,
            strategies=[name],
            strategy_folders=[folder],
            isolate_network=True,
            log_dir=tmp,
            grace_period=5,
            profile=False,
        ).optimize(study, objectives.same_curve, n_trials=1)
        results[name] = study.trials[0]
    return results


def _complete(trial):
    assert trial.state == TrialState.COMPLETE, trial.system_attrs.get("saturn:fail_reason")
    return {**trial.user_attrs, **trial.system_attrs}  # (the objective's, and the sweep's records)


@pytest.mark.parametrize("name", AGAINST_SINGLE)
def test_loss_curve_matches_single(runs, name):
    reference = _complete(runs["single"])["losses"]
    losses = _complete(runs[name])["losses"]
    assert losses == pytest.approx(reference, rel=LOSS_TOLERANCE)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("name", list(ACCUMULATING))
def test_gradient_accumulation_splits_each_device_batch(runs, name):
    """Global batch 16: each micro-batch holds 16 / (devices x micro-batches) rows, and the curve still matches."""
    attrs = _complete(runs[name])
    micro_batches = ACCUMULATING[name][1]
    devices = 1 if name.startswith("single") else 2
    assert attrs["saturn:gradient_accumulation"] == attrs["facts"]["gradient_accumulation"] == micro_batches
    assert attrs["facts"]["micro_batch_rows"] == [16 // (devices * micro_batches)]
    assert _complete(runs[ACCUMULATING[name][0]])["facts"]["micro_batch_rows"] == [16 // devices]


def test_threads_runs_one_process_on_the_cores_of_both_devices(runs):
    """``threads`` x2: the objective runs once, in a process group of one, with every core of both CPU devices as
    its torch threads; DDP x2 runs two processes of one device's cores each."""
    cores = len(os.sched_getaffinity(0))
    threads, ddp = _complete(runs["threads"])["facts"], _complete(runs["ddp"])["facts"]
    assert runs["threads"].system_attrs["saturn:num_devices"] == 2
    assert (threads["processes"], threads["threads"]) == (1, cores)
    assert (ddp["processes"], ddp["threads"]) == (2, cores // 2)


@pytest.mark.parametrize("name", ["fsdp", "fsdp-ckpt", "fsdp-offload"])
def test_fsdp_parameters_are_sharded_dtensors(runs, name):
    facts = _complete(runs[name])["facts"]
    assert facts["sharded_params"] is True
    assert facts["local_fraction"] == pytest.approx(0.5, abs=0.05)  # each of 2 ranks holds about half
    assert facts["fsdp_offload"] == ("CPUOffloadPolicy" if name == "fsdp-offload" else "OffloadPolicy")


@pytest.mark.parametrize(
    ("name", "stage", "optimizer"),
    [
        ("zero1", 1, "DeepSpeedZeroOptimizer"),
        ("zero2", 2, "DeepSpeedZeroOptimizer"),
        ("zero3", 3, "DeepSpeedZeroOptimizer_Stage3"),
        ("zero3-offload", 3, "DeepSpeedZeroOptimizer_Stage3"),
    ],
)
def test_deepspeed_optimizer_is_the_zero_stage_optimizer(runs, name, stage, optimizer):
    facts = _complete(runs[name])["facts"]
    assert facts["zero_stage"] == stage and facts["optimizer"] == optimizer
    offload = name.endswith("offload")
    assert facts["zero_offload_optimizer"] is offload and facts["zero_offload_param"] is offload
