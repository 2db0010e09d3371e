"""ZeRO's communication buffers sized to the model and the device (issue 46, the shared node; the rules in
:mod:`optuna_saturn.engines._deepspeed_buckets`): ZeRO-3's by the hidden size, not by the largest parameter (a
language model's embedding), and ZeRO-1/2's reduce buckets, doubled by ``overlap_comm``, by the device's memory
and the model's size instead of DeepSpeed's fixed 5e8 elements. Models are built from their configs on the meta
device: their shapes, no weights, nothing downloaded."""

from __future__ import annotations

import pytest
import torch

from optuna_saturn.engines import _deepspeed
from optuna_saturn.engines._base import WorkerContext
from optuna_saturn.engines._deepspeed_buckets import device_memory_of, hidden_size, size_buckets

GIB = 1024**3


def _on_meta(config) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _gpt2(layers: int, width: int) -> torch.nn.Module:
    from transformers import GPT2Config

    return _on_meta(GPT2Config(n_embd=width, n_layer=layers, n_head=width // 64, vocab_size=50257))


def _largest(model: torch.nn.Module) -> int:
    return max(p.numel() for p in model.parameters())


def test_zero3_buckets_are_the_hidden_size_squared_not_the_embedding():
    """GPT-2's largest parameter is its 50,257 x 768 embedding (38.6 M elements); its hidden size is 768."""
    model = _gpt2(layers=2, width=768)
    assert hidden_size(model) == 768 and _largest(model) == 50257 * 768
    zero = {"stage": 3}
    size_buckets(model, zero, world_size=2, device_memory=80 * GIB)
    assert zero["reduce_bucket_size"] == 768**2  # (Hugging Face's "auto")
    assert zero["stage3_prefetch_bucket_size"] == int(0.9 * 768**2)
    assert zero["stage3_param_persistence_threshold"] == 7680
    total = sum(p.numel() for p in model.parameters())
    assert zero["stage3_max_live_parameters"] == zero["stage3_max_reuse_distance"] == total // 2  # a shard's worth


def test_zero3_buckets_of_an_8b_language_model_are_67_mb_not_2_gb():
    """Llama 3 8B's shapes (two of its 32 layers): the embedding is 128,256 x 4,096 = 525 M elements, a 2.1 GB
    float32 bucket when the largest parameter sized it; the hidden size squared is 16.8 M, 67 MB."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=2,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
    )
    model = _on_meta(config)
    assert hidden_size(model) == 4096 and _largest(model) == 128256 * 4096
    zero = {"stage": 3, "offload_param": {"device": "cpu"}}
    size_buckets(model, zero, world_size=8, device_memory=80 * GIB)
    assert zero["reduce_bucket_size"] == 4096**2 and zero["reduce_bucket_size"] * 4 < 70e6


def test_zero12_reduce_buckets_take_a_64th_of_the_devices_memory_at_most():
    """DeepSpeed's default, 5e8 elements, doubled by overlap_comm: 4 GB of float32 buckets on every GPU. A 1.6 B
    model on an 80 GiB GPU gets 1/64 of it, 1.34 GB, in its two buckets; on a 24 GiB GPU, 0.4 GB."""
    model = _gpt2(layers=48, width=1600)
    assert sum(p.numel() for p in model.parameters()) > 1.5e9
    for memory in (80 * GIB, 24 * GIB):
        zero = {"stage": 2, "overlap_comm": True}
        size_buckets(model, zero, world_size=8, device_memory=memory)
        assert 2 * zero["reduce_bucket_size"] * 4 == pytest.approx(memory / 64, rel=1e-6)
        alone = {"stage": 2}  # without overlap_comm: one bucket, twice as large
        size_buckets(model, alone, world_size=8, device_memory=memory)
        assert alone["reduce_bucket_size"] == pytest.approx(2 * zero["reduce_bucket_size"], abs=1)
    huge = {"stage": 1, "overlap_comm": True}
    size_buckets(model, huge, world_size=8, device_memory=10_000 * GIB)  # never above DeepSpeed's own
    assert huge["reduce_bucket_size"] == 500_000_000


def test_zero12_reduce_buckets_are_no_larger_than_the_models_gradients():
    model = _gpt2(layers=12, width=768)  # GPT-2 small: 124 M parameters
    total = sum(p.numel() for p in model.parameters())
    zero = {"stage": 2, "overlap_comm": True}
    size_buckets(model, zero, world_size=2, device_memory=80 * GIB)
    assert zero["reduce_bucket_size"] == total  # 1 GB in two buckets, not 4 GB
    on_cpu = {"stage": 2, "overlap_comm": True}
    size_buckets(model, on_cpu, world_size=2, device_memory=device_memory_of(torch.device("cpu")))
    assert on_cpu["reduce_bucket_size"] == total


def test_the_strategys_own_sizes_are_kept():
    model = _gpt2(layers=2, width=768)
    zero = {"stage": 3, "reduce_bucket_size": 123, "stage3_prefetch_bucket_size": 45}
    size_buckets(model, zero, world_size=2, device_memory=80 * GIB)
    assert (zero["reduce_bucket_size"], zero["stage3_prefetch_bucket_size"]) == (123, 45)
    zero = {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 7}
    size_buckets(model, zero, world_size=2, device_memory=80 * GIB)
    assert zero["reduce_bucket_size"] == 7


def test_a_zero2_engine_hands_deepspeed_buckets_sized_to_its_devices_memory(monkeypatch):
    """The worker reads its GPU's memory (faked here) and DeepSpeed is given the sized config."""
    import deepspeed

    given: list[dict] = []

    class Given(Exception):
        pass

    def initialize(*, config, **kwargs):
        given.append(config)
        raise Given

    monkeypatch.setattr(deepspeed, "initialize", initialize)
    monkeypatch.setattr(_deepspeed, "device_memory_of", lambda device: 24 * GIB)
    context = WorkerContext(
        rank=0,
        local_rank=0,
        world_size=2,
        device=torch.device("cpu"),
        knobs={},
        launcher_config={"zero_optimization": {"stage": 2, "overlap_comm": True}},
        strategy="zero2",
    )
    model = torch.nn.Sequential(*(torch.nn.Linear(4096, 4096) for _ in range(4)))  # 67 M parameters
    with pytest.raises(Given):
        _deepspeed.DeepSpeedEngine(context).prepare_model_and_optimizer(model, torch.optim.AdamW(model.parameters()))
    assert given[0]["zero_optimization"]["reduce_bucket_size"] == int(24 * GIB / 64) // 8
