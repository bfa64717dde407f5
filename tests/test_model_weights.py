"""Weight estimates against the parameter counts the model makers publish."""

from __future__ import annotations

import pytest

from kvplan.model.config import load_config, read_model
from kvplan.model.weights import estimate_weights
from tests.conftest import hf_config

# (total params, active params) in billions, as published on the model cards / papers.
PUBLISHED = {
    "meta-llama--Meta-Llama-3.1-8B": (8.03, None),
    "meta-llama--Meta-Llama-3.1-70B": (70.6, None),
    "meta-llama--Meta-Llama-3.1-405B": (405.9, None),
    "mistralai--Mixtral-8x7B-v0.1": (46.7, 12.9),
    "Qwen--Qwen3-30B-A3B": (30.5, 3.3),
    "Qwen--Qwen3-235B-A22B": (235.0, 22.0),
    "deepseek-ai--DeepSeek-V3": (671.0, 37.0),
    "deepseek-ai--DeepSeek-V2-Lite": (15.7, 2.4),
    "moonshotai--Kimi-K2-Instruct": (1040.0, 32.0),
    "google--gemma-2-9b-it": (9.24, None),
    "openai-community--gpt2": (0.124, None),
    "tiiuae--falcon-180B": (180.0, None),
    "openai--gpt-oss-120b": (116.8, None),
    "Qwen--Qwen3-Next-80B-A3B-Instruct": (80.0, None),  # card's "3B activated" leaves out embeddings
    "nvidia--Llama-3_3-Nemotron-Super-49B-v1": (49.9, None),
}


@pytest.mark.parametrize("folder, published", sorted(PUBLISHED.items()))
def test_params_match_published(folder, published):
    """Counting the matrices must land within 3% of the published total (15% for active, which
    model cards round and sometimes count without embeddings)."""
    path = hf_config(folder)
    est = estimate_weights(read_model(load_config(path), folder, str(path)))
    total, active = published
    assert est.params / 1e9 == pytest.approx(total, rel=0.03)
    if active is not None:
        assert est.active_params / 1e9 == pytest.approx(active, rel=0.15)


def test_bytes_follow_dtype_and_quantization():
    """bf16 weights are 2 bytes per param; Kimi K2's fp8 checkpoint is about 1 byte per param."""
    llama = hf_config("meta-llama--Meta-Llama-3.1-8B")
    est = estimate_weights(read_model(load_config(llama), "l", str(llama)))
    assert est.bytes == est.params * 2
    kimi = hf_config("moonshotai--Kimi-K2-Instruct")
    est = estimate_weights(read_model(load_config(kimi), "k", str(kimi)))
    assert est.bytes / est.params == pytest.approx(1.0, rel=0.01)


def test_tied_embeddings_counted_once():
    """Tying the LM head to the embeddings removes vocab x hidden parameters."""
    raw = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "max_position_embeddings": 128, "torch_dtype": "bfloat16", "vocab_size": 1000, "intermediate_size": 128}
    untied = estimate_weights(read_model({**raw, "tie_word_embeddings": False}, "a", "a")).params
    tied = estimate_weights(read_model({**raw, "tie_word_embeddings": True}, "a", "a")).params
    assert untied - tied == 1000 * 64
    # by hand: embeddings 2*1000*64; per layer q,k,v,o 4*64*64 and gated MLP 3*64*128
    assert untied == 2 * 1000 * 64 + 2 * (4 * 64 * 64 + 3 * 64 * 128)
