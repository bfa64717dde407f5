"""GPU fit: blocks, tokens and concurrency against the lesson, Kwon et al. Table 1 and vLLM's log line."""

from __future__ import annotations

import pytest

from kvplan.model.build import build_layout
from kvplan.model.config import read_model
from kvplan.model.fit import size_model
from kvplan.model.gpus import get_gpu
from tests.test_model_config import LLAMA3_8B

GiB = 2**30


def layout(raw, tp=1):
    return build_layout(read_model(raw, "m", "m"), "auto", tp)


OPT_13B = {"model_type": "opt", "hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 40,
           "max_position_embeddings": 2048, "torch_dtype": "float16", "vocab_size": 50272, "ffn_dim": 20480}
OPT_175B = {"model_type": "opt", "hidden_size": 12288, "num_hidden_layers": 96, "num_attention_heads": 96,
            "max_position_embeddings": 2048, "torch_dtype": "float16", "vocab_size": 50272, "ffn_dim": 49152}


def test_vllm_startup_line_llama3_8b():
    """11.12 GiB / (16 x 128 KiB) = 5,693.44 -> 5,693 blocks; 5,693 / 512 = 11.12x at 8,192 tokens."""
    r = size_model(layout(LLAMA3_8B), tokens=8192, block_size=16, kv_memory=int(11.12 * GiB))
    assert r.num_blocks == 5693
    assert f"{r.vllm_concurrency:.2f}" == "11.12"
    assert r.vllm_kv_cache_tokens == int(5693 / 512 * 8192)
    assert r.usable_blocks == 5692 and r.max_tokens == 5692 * 16
    assert r.max_concurrency == 11  # whole 8,192-token requests in 5,692 usable blocks of 512 each


def test_kwon_table1_opt_13b():
    """OPT-13B with 12 GiB of KV holds 15.7K token slots (12 GiB / 800 KiB = 15,728)."""
    r = size_model(layout(OPT_13B), tokens=2048, kv_memory=12 * GiB)
    assert r.token_slots == 15_728


def test_kwon_table1_opt_175b_on_8_gpus():
    """OPT-175B, 264 GiB over 8 GPUs (33 GiB each), 4.5 MiB/token split 8 ways: 60,074 slots (60.1K)."""
    lay = layout(OPT_175B, tp=8)
    assert lay.bytes_per_token * 8 == 2 * 96 * 12288 * 2
    r = size_model(lay, tokens=2048, kv_memory=33 * GiB)
    assert r.token_slots == 60_074


def test_gpu_pool_subtracts_weights():
    """The pool is memory x utilization minus this GPU's share of the weights."""
    gpu = get_gpu("H100-80GB")
    r = size_model(layout(LLAMA3_8B), tokens=8192, gpu=gpu, weight_bytes=16 * 10**9, gpu_memory_utilization=0.9)
    assert r.kv_pool_bytes == int(gpu.memory_bytes * 0.9) - 16 * 10**9
    r2 = size_model(layout(LLAMA3_8B, tp=2), tokens=8192, gpu=gpu, weight_bytes=16 * 10**9, gpu_memory_utilization=0.9)
    assert r2.kv_pool_bytes == int(gpu.memory_bytes * 0.9) - 8 * 10**9


def test_nothing_fits_gives_longest_context():
    """1 GiB of Llama-3-8B KV: 512 blocks, 511 usable, so 8,192 tokens do not fit but 8,176 do."""
    r = size_model(layout(LLAMA3_8B), tokens=8192, kv_memory=GiB)
    assert r.num_blocks == 512 and r.max_concurrency == 0 and r.fits is False
    assert r.longest_context == 511 * 16


def test_weights_larger_than_gpu():
    """When the weights exceed the GPU, the pool is empty (never negative) and nothing fits."""
    r = size_model(layout(LLAMA3_8B), tokens=1024, gpu=get_gpu("L4"), weight_bytes=140 * GiB)
    assert r.kv_pool_bytes == 0 and r.max_concurrency == 0 and r.fits is False and r.longest_context == 0


@pytest.mark.parametrize("field, kwargs", [("tokens", {"tokens": 0}), ("batch", {"batch": -1}),
                                           ("block-size", {"block_size": 0}),
                                           ("gpu-memory-utilization", {"gpu_memory_utilization": 1.5})])
def test_bad_numbers_rejected(field, kwargs):
    """Zero, negative and out-of-range settings are errors naming the option."""
    from kvplan.errors import UsageError

    args = {"tokens": 100, **kwargs}
    with pytest.raises(UsageError) as err:
        size_model(layout(LLAMA3_8B), **args)
    assert field in str(err.value)
