"""kvplan's bytes per token per layer against the KV cache of Hugging Face transformers itself."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")

from tests.conftest import torch_one_thread  # noqa: E402

from kvplan.backends.torch.crosscheck import TransformersNotInstalled, crosscheck, transformers_module  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    yield from torch_one_thread(torch)


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


@pytest.mark.parametrize("model, kinds, bytes_per_token", [
    ("meta-llama/Meta-Llama-3-8B", ["full", "full"], 2 * 8 * 128 * 2),
    ("Qwen/Qwen3-0.6B", ["full", "full"], 2 * 8 * 128 * 2),
    ("google/gemma-2-2b-it", ["sliding", "full"], 2 * 4 * 256 * 2),
    ("openai-community/gpt2", ["full", "full"], 2 * 12 * 64 * 2),
])
def test_transformers_cache_holds_what_kvplan_predicts(transformers, model, kinds, bytes_per_token):
    """Each layer's K/V tensors in transformers' cache cost kvplan's bytes per token, hold the tokens
    kvplan says, and grow by exactly that much on one decode step."""
    result = crosscheck(model, tokens=9)
    assert result.ok, result.to_dict()
    assert [r.kind for r in result.rows] == kinds
    for row in result.rows:
        assert row.hf_bytes_per_token == row.kvplan_bytes_per_token == bytes_per_token
        assert row.hf_tokens_held == row.kvplan_tokens_held == 9
        assert row.hf_decode_growth == bytes_per_token
    assert "hidden_size" not in result.shrunk or model != "openai-community/gpt2"  # gpt2's head_dim is hidden / heads


def test_gemma3_window_caps_the_sliding_layer(transformers):
    """Past the 512-token window, transformers keeps window - 1 = 511 tokens, kvplan counts 512 (the
    tokens one step reads); the global layer keeps all 520. A known, reported difference of one token."""
    result = crosscheck("google/gemma-3-1b-it", tokens=520)
    sliding, full = result.rows
    assert (sliding.kind, sliding.hf_tokens_held, sliding.kvplan_tokens_held) == ("sliding", 511, 512)
    assert "window - 1" in sliding.note and sliding.hf_decode_growth == 0
    assert (full.kind, full.hf_tokens_held, full.hf_decode_growth) == ("full", 520, 1024)
    assert result.ok


def test_qwen3_next_linear_attention_state_difference_is_pinned(transformers):
    """Gated DeltaNet state: transformers keeps the conv state with all 4 kernel columns (kvplan and
    vLLM keep 3) and the recurrent state in float32 (kvplan: the model's bf16). Pinned so a change on
    either side shows up; the attention layer agrees exactly."""
    result = crosscheck("Qwen/Qwen3-Next-80B-A3B-Instruct", tokens=9)
    state, full = result.rows
    conv_dim = 2 * 16 * 128 + 32 * 128
    assert state.kvplan_elems == 3 * conv_dim + 32 * 128 * 128 == 548_864
    assert state.hf_elems - state.kvplan_elems == conv_dim
    assert set(state.hf_dtypes.values()) == {"bfloat16", "float32"} and not state.ok
    assert state.hf_decode_growth == 0
    assert full.ok and full.hf_bytes_per_token == 2 * 2 * 256 * 2


def test_missing_transformers_is_a_kvplan_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(TransformersNotInstalled, match="transformers is not installed"):
        transformers_module()
