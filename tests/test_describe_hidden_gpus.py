"""Describing a trial while the GPUs are hidden (issue 46, the shared node): a bf16 or fp16 Trainer, Accelerate or
Lightning objective is described (not planned from runtime estimates), what transformers concludes about the hidden
GPUs does not outlive the description, and no CUDA check is made with the GPUs in sight."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import hf_objectives
import lightning_objectives
import optuna
import pytest
import torch

from optuna_saturn import SaturnExecutor
from optuna_saturn.profiler import probe_workload
from optuna_saturn.profiler._without_gpus import without_gpus

TESTS = Path(__file__).parent

#: What describing tests/hf_objectives.tiny_gpt2 under any precision must measure: 2 layers of width 32 over 96
#: tokens (32,128 parameters, in float32: autocast leaves the weights as they are), 8 rows of 16 tokens, 2 epochs of
#: 48 rows (12 optimizer steps), AdamW's 2 states per parameter.
TINY_GPT2 = {
    "n_params": 32_128,
    "bytes_per_param": 4,
    "batch_signature": ".input_ids:(8, 16):torch.int64;.labels:(8, 16):torch.int64",
    "total_steps": 12,
    "global_batch": 8,
    "tokens_per_step": 128,
    "optimizer_states": 2,
}


def _measured(workload) -> dict:
    return {name: getattr(workload, name) for name in TINY_GPT2}


def _describe(objective, precision: str, monkeypatch):
    monkeypatch.setenv("SATURN_TEST_PRECISION", precision)
    return probe_workload(objective, optuna.create_study().ask(), threading.Lock())


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_mixed_precision_trainer_is_described_while_transformers_is_imported_by_the_objective(precision):
    """In the describer, transformers is first imported by the objective, while the GPUs are hidden: its bf16
    check raised there (``Your setup doesn't support bf16/gpu``), and the trial was planned from estimates. A
    fresh interpreter, as the describer's first description is."""
    script = (
        "import json, sys, threading, optuna, hf_objectives\n"
        "from optuna_saturn.profiler import probe_workload\n"
        "assert 'transformers.training_args' not in sys.modules\n"
        "w = probe_workload(hf_objectives.trainer_gpt2, optuna.create_study().ask(), threading.Lock())\n"
        "print('WORKLOAD=' + json.dumps(w.to_json()))\n"
    )
    env = {**os.environ, "SATURN_TEST_PRECISION": precision, "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    ran = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    assert ran.returncode == 0, ran.stderr[-3000:]
    line = next(x for x in ran.stdout.splitlines() if x.startswith("WORKLOAD="))
    measured = json.loads(line.removeprefix("WORKLOAD="))
    assert {name: measured[name] for name in TINY_GPT2} == TINY_GPT2


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_mixed_precision_trainer_is_described_where_transformers_is_already_imported(precision, monkeypatch):
    import transformers.training_args

    check = transformers.training_args.is_torch_bf16_gpu_available
    assert _measured(_describe(hf_objectives.trainer_gpt2, precision, monkeypatch)) == TINY_GPT2
    assert transformers.training_args.is_torch_bf16_gpu_available is check  # (transformers' own, put back)


@pytest.mark.parametrize(
    "objective", [hf_objectives.accelerate_gpt2, lightning_objectives.lightning_gpt2], ids=["accelerate", "lightning"]
)
def test_bf16_accelerate_and_lightning_objectives_are_described(objective, monkeypatch):
    workload = _describe(objective, "bf16", monkeypatch)
    assert (workload.n_params, workload.bytes_per_param) == (TINY_GPT2["n_params"], 4)
    assert workload.batch_signature == TINY_GPT2["batch_signature"] and workload.total_steps > 0


def test_what_transformers_caches_about_the_hidden_gpus_is_forgotten_when_they_are_shown_again(monkeypatch):
    """transformers caches its hardware answers for the life of the process. The pool host warms the objective up
    with the GPUs hidden, then forks the workers: a "no bf16" cached then would make every worker's
    ``TrainingArguments(bf16=True)`` raise on its GPU."""
    from transformers.utils import import_utils

    probe = import_utils.is_torch_bf16_gpu_available
    probe.cache_clear()
    try:
        with without_gpus():
            assert probe() is False  # (no GPU in sight: hidden, and none on this machine)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a worker, on its GPU
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
        assert probe() is True
    finally:
        probe.cache_clear()


@pytest.mark.launch
def test_a_bf16_trainer_trial_is_profiled_from_its_description(tmp_path, saturn_options, monkeypatch):
    """Profiles need a description: a trial planned from runtime estimates has none."""
    monkeypatch.setenv("SATURN_TEST_PRECISION", "bf16")  # (read by the objective in the describer and the workers)
    saturn_options.update(progress=None)
    executor = SaturnExecutor(devices=1, strategies=["single"], **saturn_options)
    study = executor.profile(hf_objectives.trainer_gpt2, n_trials=1)
    (profile,) = study.trials[0].system_attrs["saturn:profiles"]
    assert profile["strategy"] == "single" and profile["feasible"] and profile["step_seconds"] > 0, profile


def test_describing_makes_no_cuda_check_with_the_gpus_in_sight(monkeypatch):
    """Putting the executor's state back after a description resets torch._dynamo, which asks
    ``torch.cuda.is_available()``; it ran after the GPUs were shown again, with no NVML check asked for, and so
    initialised the CUDA driver in the executor (../shared/notes/gpu-verify.md, N4). Every CUDA check made while
    describing is recorded with what it saw (faked: no CUDA here)."""
    import torch._dynamo  # (imported, as with any objective that imports transformers.Trainer)

    from optuna_saturn.profiler import _without_gpus

    seen: list[tuple[str | None, str | None]] = []

    def recorded(answer):
        def check(*args, **kwargs):
            seen.append((os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")))
            return answer

        return check

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: True)  # (a CUDA build: DeepSpeed's pick is made)
    monkeypatch.setattr(torch.cuda, "is_available", recorded(False))
    monkeypatch.setattr(torch.cuda, "device_count", recorded(0))
    monkeypatch.setattr(_without_gpus, "visible_gpu_count", lambda: 4)  # (NVML's count: no CUDA check)
    accelerators: list[str | None] = []

    def objective(trial):
        accelerators.append(os.environ.get("DS_ACCELERATOR"))
        model = torch.nn.Linear(4, 1)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(8, 4)), batch_size=2)
        model, loader = trial.prepare(model, loader)
        for _ in trial.steps(3):
            pass
        return 0.0

    workload = probe_workload(objective, optuna.create_study().ask(), threading.Lock())
    assert workload.total_steps == 3 and accelerators == ["cuda"]
    assert seen, "no CUDA check was made: the test no longer sees the one torch._dynamo.reset makes"
    assert set(seen) == {("", "1")}, seen
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"  # (shown again after)
