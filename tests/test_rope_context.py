"""The default max_model_len vLLM derives from a config's RoPE scaling (vllm/config/model.py,
_get_and_verify_max_len), counted by hand."""

from __future__ import annotations

import pytest

from kvplan.errors import ConfigError
from kvplan.model.config import read_model

BASE = {"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 32768}


@pytest.mark.parametrize("rope, context", [
    (None, 32768),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 131072),
    ({"type": "linear", "factor": 2.0}, 65536),
    ({"rope_type": "dynamic", "factor": 1.5}, 49152),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}, 32768),
    ({"type": "longrope", "factor": 4.0}, 32768),
    ({"rope_type": "default", "rope_theta": 1e6}, 32768),
])  # fmt: skip
def test_rope_scaling_sets_the_context(rope, context):
    assert read_model({**BASE, "rope_scaling": rope}, "m", "m/config.json").max_context == context


def test_per_layer_type_rope_parameters_and_the_smallest_context_field():
    rope = {"full_attention": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4096},
            "sliding_attention": {"rope_type": "default"}}
    assert read_model({**BASE, "rope_parameters": rope}, "m", "c").max_context == 8192
    assert read_model({**BASE, "seq_length": 4096}, "m", "c").max_context == 4096


def test_gemma3_context_already_counts_its_scaling():
    cfg = {**BASE, "model_type": "gemma3_text", "max_position_embeddings": 131072,
           "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    assert read_model(cfg, "m", "c").max_context == 131072


@pytest.mark.parametrize("rope, field", [
    ({"rope_type": "yarn", "factor": 4.0}, "rope_scaling.original_max_position_embeddings"),
    ({"rope_type": "linear", "factor": "4"}, "rope_scaling.factor"),
    ({"rope_type": 7}, "rope_scaling.rope_type"),
    ({"rope_type": "linear", "factor": 1e30}, "rope_scaling.factor"),
    ([1, 2], "rope_scaling"),
])  # fmt: skip
def test_a_bad_rope_field_is_one_located_error(rope, field):
    with pytest.raises(ConfigError) as err:
        read_model({**BASE, "rope_scaling": rope}, "m", "m/config.json")
    assert field in str(err.value) and "m/config.json" in str(err.value)
