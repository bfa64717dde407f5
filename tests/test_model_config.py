"""The config reader and layout builder against real configs and hand-worked numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvplan.errors import ConfigError, UsageError
from kvplan.model.build import build_layout
from kvplan.model.config import load_config, read_model
from tests.conftest import hf_config, shared_dir


def layout_of(raw: dict, kv_dtype: str = "auto", tp: int = 1, name: str = "test"):
    return build_layout(read_model(raw, name, f"{name}/config.json"), kv_dtype, tp)


def real_layout(folder: str, kv_dtype: str = "auto", tp: int = 1):
    path = hf_config(folder)
    return build_layout(read_model(load_config(path), folder, str(path)), kv_dtype, tp)


LLAMA3_8B = {
    "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
    "vocab_size": 128256, "intermediate_size": 14336, "tie_word_embeddings": False,
}

# Bytes per token on one GPU, each worked out by hand from the file's fields:
# 2 (K and V) x layers x kv_heads x head_dim x bytes, plus what the comment says.
REAL_BYTES_PER_TOKEN = {
    "meta-llama--Meta-Llama-3.1-8B": 131_072,  # 2*32*8*128*2 (the lesson's 128 KiB)
    "meta-llama--Meta-Llama-3.1-70B": 327_680,  # 2*80*8*128*2
    "meta-llama--Meta-Llama-3.1-405B": 516_096,  # 2*126*8*128*2
    "meta-llama--Llama-2-7b-hf": 524_288,  # MHA: 2*32*32*128*2
    "meta-llama--Llama-3.2-1B-Instruct": 32_768,  # head_dim 64 given: 2*16*8*64*2
    "Qwen--Qwen3-0.6B": 114_688,  # head_dim 128 given (not 1024/16=64): 2*28*8*128*2
    "Qwen--Qwen3-32B": 262_144,  # 2*64*8*128*2
    "THUDM--chatglm2-6b": 28_672,  # multi_query_group_num 2, kv_channels 128, fp16: 2*28*2*128*2
    "tiiuae--falcon-7b": 8_192,  # old names, multi_query: 1 KV head, 4544/71=64: 2*32*1*64*2
    "tiiuae--falcon-40b": 122_880,  # new_decoder_architecture, num_kv_heads 8, 8192/128=64: 2*60*8*64*2
    "bigcode--starcoderbase-7b": 21_504,  # gpt_bigcode multi_query, float32 served fp16: 2*42*1*128*2
    "openai-community--gpt2": 36_864,  # n_layer 12, n_head 12, n_embd 768 (64/head), fp16: 2*12*12*64*2
    "mosaicml--mpt-7b": 524_288,  # d_model 4096, n_heads 32, MHA: 2*32*32*128*2
    "deepseek-ai--DeepSeek-V3": 70_272,  # MLA: 61*(512+64)*2
    "deepseek-ai--DeepSeek-V2-Lite": 31_104,  # MLA: 27*(512+64)*2
    "moonshotai--Kimi-K2-Instruct": 70_272,  # MLA like V3: 61*576*2
    "google--gemma-2-9b-it": 344_064,  # 42 layers (21 sliding + 21 full), 8 KV x 256: 2*42*8*256*2
    "google--gemma-3-1b-it": 26_624,  # 26 layers, 1 KV head x 256: 2*26*1*256*2
    "Qwen--Qwen3-Next-80B-A3B-Instruct": 24_576,  # only 48/4 = 12 full-attention layers: 2*12*2*256*2
    "nvidia--Nemotron-H-56B-Base-8K": 40_960,  # 10 '*' layers in the pattern: 2*10*8*128*2
    "nvidia--Llama-3_3-Nemotron-Super-49B-v1": 200_704,  # 49 of 80 layers attend, 64/8 = 8 KV: 2*49*8*128*2
    "openai--gpt-oss-20b": 49_152,  # 24 layers (12 sliding), 8 KV x 64: 2*24*8*64*2
    "meta-llama--Llama-4-Scout-17B-16E-Instruct": 196_608,  # text_config: 2*48*8*128*2
    "microsoft--Phi-3.5-mini-instruct": 393_216,  # MHA 32 x 96: 2*32*32*96*2
}


@pytest.mark.parametrize("folder, expected", sorted(REAL_BYTES_PER_TOKEN.items()))
def test_real_config_bytes_per_token(folder, expected):
    """A wrong alias, head_dim rule, MQA/GQA rule or per-layer kind would change these sums."""
    assert real_layout(folder).bytes_per_token == expected


def test_every_shared_config_loads():
    """Every real config in the corpus must read without error and give a positive size."""
    root = shared_dir() / "hf-configs"
    paths = sorted(root.glob("*/config.json"))
    if not paths:
        pytest.skip("no hf-configs corpus")
    assert len(paths) >= 40
    for path in paths:
        layout = build_layout(read_model(load_config(path), path.parent.name, str(path)))
        assert layout.bytes_per_token > 0 or layout.state_bytes > 0, path


def test_lesson_numbers_llama3_8b():
    """The lesson: 128 KiB per token, 8,192 tokens = 1 GiB exactly, 1,000 tokens = 125 MiB."""
    layout = layout_of(LLAMA3_8B)
    assert layout.bytes_per_token == 131_072
    assert layout.kv_bytes(8192) == 2**30
    assert layout.kv_bytes(1000) == 125 * 2**20


def test_lesson_quiz_model():
    """Quiz 3: 24 layers, 4 KV heads, head 64, fp16: 24,576 B/token, 49,152,000 B for 2,000 tokens."""
    raw = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 24, "num_attention_heads": 8,
           "num_key_value_heads": 4, "max_position_embeddings": 4096, "torch_dtype": "float16", "vocab_size": 1000}
    layout = layout_of(raw)
    assert layout.bytes_per_token == 24_576
    assert layout.kv_bytes(2000) == 49_152_000


def test_opt_13b_numbers():
    """Kwon et al.: OPT-13B needs 800 KiB per token and 1.5625 GiB for 2,048 tokens."""
    raw = {"model_type": "opt", "hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 40,
           "max_position_embeddings": 2048, "torch_dtype": "float16", "vocab_size": 50272, "ffn_dim": 20480}
    layout = layout_of(raw)
    assert layout.bytes_per_token == 819_200
    assert layout.kv_bytes(2048) == int(1.5625 * 2**30)


def test_sliding_window_caps_tokens_held():
    """Gemma 2 2B: 13 sliding layers hold at most 4,096 tokens, 13 full layers hold all."""
    layout = real_layout("google--gemma-2-2b-it")
    per_layer = 2 * 4 * 256 * 2
    assert layout.kv_bytes(1000) == 26 * per_layer * 1000
    assert layout.kv_bytes(8192) == 13 * per_layer * 8192 + 13 * per_layer * 4096


def test_window_off_or_longer_than_context_is_ignored():
    """Qwen2's use_sliding_window false and Phi-3.5's 262,144 window over a 131,072 context are no windows."""
    assert {g.kind for g in real_layout("Qwen--Qwen2-7B-Instruct").groups} == {"full"}
    assert {g.kind for g in real_layout("microsoft--Phi-3.5-mini-instruct").groups} == {"full"}


def test_layer_types_and_pattern():
    """gpt-oss alternates sliding (128) and full; Gemma 3 makes every 6th layer global."""
    oss = {g.kind: g for g in real_layout("openai--gpt-oss-20b").groups}
    assert oss["sliding"].num_layers == 12 and oss["sliding"].window == 128 and oss["full"].num_layers == 12
    gemma = {g.kind: g for g in real_layout("google--gemma-3-1b-it").groups}
    assert gemma["full"].num_layers == 4 and gemma["sliding"].num_layers == 22 and gemma["sliding"].window == 512


def test_global_sliding_window_mistral_v01():
    """A global sliding_window applies to every layer (Mistral 7B v0.1: 4,096 of 32,768)."""
    raw = {**LLAMA3_8B, "model_type": "mistral", "sliding_window": 4096, "max_position_embeddings": 32768}
    layout = layout_of(raw)
    assert [(g.kind, g.window) for g in layout.groups] == [("sliding", 4096)]
    assert layout.kv_bytes(32768) == 131_072 * 4096


def test_mamba_state_is_per_sequence():
    """Nemotron-H Mamba2 layers keep a constant state: conv 3*(16384+2*8*256) + ssm 16384*256 elements."""
    layout = real_layout("nvidia--Nemotron-H-56B-Base-8K")
    state = {g.kind: g for g in layout.groups}["state"]
    assert state.num_layers == 54
    assert state.state_elems == 3 * (256 * 64 + 2 * 8 * 256) + 256 * 64 * 256
    assert layout.kv_bytes(100) - layout.kv_bytes(99) == layout.bytes_per_token
    assert layout.kv_bytes(1) == layout.bytes_per_token + 54 * state.state_elems * 2


def test_deltanet_state_qwen3_next():
    """Qwen3-Next linear layers: conv 3*(2*16*128 + 32*128) + 32 value heads x 128 x 128."""
    state = {g.kind: g for g in real_layout("Qwen--Qwen3-Next-80B-A3B-Instruct").groups}["state"]
    assert state.num_layers == 36
    assert state.state_elems == 3 * (2 * 16 * 128 + 32 * 128) + 32 * 128 * 128


def test_jamba_layers():
    """Jamba: attention at layers 4, 12, 20, 28 (period 8, offset 4); Mamba1 state elsewhere."""
    raw = {"model_type": "jamba", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "max_position_embeddings": 262144, "torch_dtype": "bfloat16",
           "vocab_size": 65536, "attn_layer_period": 8, "attn_layer_offset": 4, "mamba_d_state": 16,
           "mamba_d_conv": 4, "mamba_expand": 2}
    groups = {g.kind: g for g in layout_of(raw).groups}
    assert groups["full"].num_layers == 4 and groups["state"].num_layers == 28
    assert groups["state"].state_elems == 3 * 8192 + 8192 * 16
    assert groups["full"].bytes_per_token == 2 * 4 * 8 * 128 * 2


def test_tensor_parallel_split_and_replication():
    """tp=4 splits 8 KV heads into 2 per GPU; tp=16 replicates one head per GPU; MLA is replicated."""
    assert layout_of(LLAMA3_8B, tp=4).bytes_per_token == 131_072 // 4
    assert layout_of(LLAMA3_8B, tp=16).bytes_per_token == 131_072 // 8
    assert real_layout("deepseek-ai--DeepSeek-V3", tp=8).bytes_per_token == 70_272
    with pytest.raises(UsageError):
        layout_of(LLAMA3_8B, tp=3)


def test_kv_dtype_override():
    """fp8 halves bf16; int4 quarters it; fp32 doubles it."""
    base = layout_of(LLAMA3_8B).bytes_per_token
    assert layout_of(LLAMA3_8B, "fp8").bytes_per_token == base // 2
    assert layout_of(LLAMA3_8B, "int4").bytes_per_token == base // 4
    assert layout_of(LLAMA3_8B, "fp32").bytes_per_token == base * 2


def test_text_config_nesting():
    """A multimodal config's text_config is what sizes the KV cache."""
    raw = {"model_type": "gemma3", "torch_dtype": "bfloat16", "text_config": {**LLAMA3_8B, "model_type": "gemma3_text"}}
    assert layout_of(raw).bytes_per_token == 131_072


@pytest.mark.parametrize("drop", ["num_hidden_layers", "hidden_size", "num_attention_heads"])
def test_missing_field_names_file_and_field(drop):
    """A config missing a needed field gets a one-line error naming the file and the field."""
    raw = {k: v for k, v in LLAMA3_8B.items() if k != drop}
    with pytest.raises(ConfigError) as err:
        layout_of(raw, name="m")
    text = str(err.value)
    assert "m/config.json" in text and drop in text and "\n" not in text


@pytest.mark.parametrize("key", ["max_position_embeddings", "seq_length", "n_positions", "max_seq_len",
                                 "max_sequence_length"])
def test_the_context_is_read_from_whichever_field_exists(key):
    raw = {k: v for k, v in LLAMA3_8B.items() if k != "max_position_embeddings"}
    assert layout_of({**raw, key: 4096}).max_context == 4096


def test_a_config_without_a_context_needs_tokens_only_when_sizing_to_the_context(tmp_path):
    """BLOOM (ALiBi) states no context: its layout reads, `size --tokens` works, and without
    --tokens the error names the field and says to give --tokens."""
    from kvplan.model.size import size

    raw = {k: v for k, v in LLAMA3_8B.items() if k != "max_position_embeddings"}
    assert layout_of(raw).max_context is None
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    assert size(str(path), tokens=2048, kv_memory="10GiB").report.kv_bytes == 2048 * 131_072
    with pytest.raises(ConfigError, match="give --tokens") as err:
        size(str(path))
    assert err.value.field == "max_position_embeddings"


def test_bad_values_are_errors():
    """Zero, negative, non-integer and boolean sizes are refused."""
    for bad in (0, -8, 8.5, True, "8"):
        with pytest.raises(ConfigError):
            layout_of({**LLAMA3_8B, "num_key_value_heads": bad})


def test_malformed_json(tmp_path: Path):
    """Malformed JSON reports the file and line."""
    path = tmp_path / "config.json"
    path.write_text('{\n "a": 1,\n oops\n}')
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(path) in str(err.value) and ":3" in str(err.value)


def test_never_imports_auto_map(tmp_path: Path):
    """A config with auto_map pointing at code is read as data only; no module is imported."""
    raw = {**LLAMA3_8B, "auto_map": {"AutoConfig": "evil_module.EvilConfig"}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    import sys

    build_layout(read_model(load_config(path), "x", str(path)))
    assert "evil_module" not in sys.modules


def test_qwen_window_off_unless_switched_on():
    """transformers' Qwen configs default use_sliding_window to false: a bare sliding_window is no window."""
    raw = {**LLAMA3_8B, "model_type": "qwen2", "sliding_window": 4096, "max_position_embeddings": 32768}
    assert {g.kind for g in layout_of(raw).groups} == {"full"}
    assert {g.kind for g in layout_of({**raw, "use_sliding_window": True}).groups} == {"sliding"}


def test_state_heads_must_split_evenly():
    """Nemotron-H's 256 Mamba heads split over 8 GPUs but not over 3 (vLLM refuses too)."""
    assert real_layout("nvidia--Nemotron-H-56B-Base-8K", tp=8).state_bytes > 0
    with pytest.raises(UsageError):
        real_layout("nvidia--Nemotron-H-56B-Base-8K", tp=3)
