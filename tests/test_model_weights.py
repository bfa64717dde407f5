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


# A multimodal checkpoint's vision tower, counted by hand from its vision_config: Gemma 3's SigLIP
# (27 blocks of width 1152: q, k, v, o and fc1/fc2 of 4304; 14x14 patches of 3 channels; 64x64
# learned positions at 896 px) and the projection of its 1152-wide patches into the text width.
GEMMA3_VISION = {"model_type": "siglip_vision_model", "hidden_size": 1152, "intermediate_size": 4304,
                 "num_hidden_layers": 27, "num_attention_heads": 16, "patch_size": 14, "image_size": 896,
                 "hidden_act": "gelu_pytorch_tanh"}
TEXT = {"model_type": "gemma3_text", "hidden_size": 2560, "num_hidden_layers": 2, "num_attention_heads": 8,
        "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 10240, "vocab_size": 1000,
        "max_position_embeddings": 4096}


def test_the_vision_tower_is_loaded_split_over_tp_and_never_streamed_per_token():
    text = estimate_weights(read_model({"model_type": "gemma3", "text_config": TEXT}, "m", "c"))
    both = estimate_weights(read_model({"model_type": "gemma3", "text_config": TEXT,
                                        "vision_config": GEMMA3_VISION}, "m", "c"))
    tower = 27 * (4 * 1152**2 + 2 * 1152 * 4304) + 3 * 14 * 14 * 1152 + 64 * 64 * 1152 + 1152 * 2560
    assert tower == 419_415_552  # Gemma 3's report: a 417M vision encoder, plus this 2.9M projection
    assert both.params - text.params == tower
    assert both.active_params == text.active_params  # no text token passes through it
    assert both.bytes - text.bytes == 2 * tower  # bf16
    assert both.split_bytes_per_gpu(2) == text.split_bytes_per_gpu(2)  # what a decode step streams
    assert both.bytes_per_gpu(2) - text.bytes_per_gpu(2) == tower  # half of 2 x tower on each of 2 ranks


def test_a_gated_vision_mlp_with_merged_patches_is_counted():
    """Qwen2.5-VL's ViT (SiLU: gate, up and down), its video patches of 2 frames and the projection
    of 2 x 2 merged patches into out_hidden_size, with no learned positions (no image_size)."""
    vision = {"depth": 2, "hidden_size": 64, "intermediate_size": 96, "hidden_act": "silu", "patch_size": 14,
              "temporal_patch_size": 2, "in_chans": 3, "spatial_merge_size": 2, "out_hidden_size": 128}
    text = {**TEXT, "model_type": "qwen2", "hidden_size": 128, "head_dim": 32, "intermediate_size": 256}
    base = estimate_weights(read_model({"model_type": "qwen2_5_vl", "text_config": text}, "m", "c")).params
    with_tower = estimate_weights(read_model({"model_type": "qwen2_5_vl", "text_config": text,
                                              "vision_config": vision}, "m", "c")).params
    assert with_tower - base == 2 * (4 * 64 * 64 + 3 * 64 * 96) + 3 * 14 * 14 * 64 * 2 + 64 * 4 * 128


def test_a_bad_vision_field_is_one_located_error():
    from kvplan.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        estimate_weights(read_model({"model_type": "gemma3", "text_config": TEXT,
                                     "vision_config": {**GEMMA3_VISION, "patch_size": "14"}}, "m", "m/config.json"))
    assert "vision_config.patch_size" in str(err.value) and "m/config.json" in str(err.value)
