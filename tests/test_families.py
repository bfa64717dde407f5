"""The families added for issue 17, each read by kvplan and checked against arithmetic done by hand.

Every expected number below is written out from the architecture's rule and the config's values (the
comment on each config says where the values come from), not taken from kvplan: KV bytes per token
(2 for K and V x KV heads x head dim x 2 bytes, per attention layer), recurrent-state bytes per
sequence, parameter counts and, where it matters, vLLM's hybrid KV cache groups.
"""

from __future__ import annotations

import copy
import json

import pytest

from kvplan.errors import ConfigError
from kvplan.model.build import build_layout
from kvplan.model.config import read_model
from kvplan.model.resolve import load_spec
from kvplan.model.vllm_kv_groups import kv_groups
from kvplan.model.weights import estimate_weights

BF16 = 2  # bytes

# Falcon-H1-7B: the transformers FalconH1 documentation table (44 layers, width 3072, 12 attention heads,
# 2 KV heads, 24 Mamba heads, d_head 128 / 128, d_state 256, 256K context) and copies of the hub
# config.json of tiiuae/Falcon-H1-7B-Instruct (MLP 12288, vocab 130048, mamba_d_ssm 3072, untied).
FALCON_H1_7B = {
    "model_type": "falcon_h1", "architectures": ["FalconH1ForCausalLM"],
    "hidden_size": 3072, "num_hidden_layers": 44, "num_attention_heads": 12, "num_key_value_heads": 2,
    "head_dim": 128, "intermediate_size": 12288, "vocab_size": 130048, "max_position_embeddings": 262144,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "mamba_d_ssm": 3072, "mamba_n_heads": 24, "mamba_d_head": 128, "mamba_d_state": 256, "mamba_n_groups": 1,
    "mamba_d_conv": 4, "mamba_expand": 2,
    # multipliers scale activations only (muP); they must not change any size
    "key_multiplier": 0.39, "attention_in_multiplier": 1.0, "ssm_in_multiplier": 1.25,
    "mlp_multipliers": [0.88, 0.58], "embedding_multiplier": 5.66, "lm_head_multiplier": 0.039,
}
H1_LAYERS = 44
H1_KV_PER_TOKEN_PER_LAYER = 2 * 2 * 128 * BF16  # K and V x 2 KV heads x 128
# Mamba2: a 3-step conv window over x, B, C (3072 + 2 x 1 x 256 channels) + 24 heads x 128 x 256 state
H1_STATE_ELEMS = (4 - 1) * (3072 + 2 * 1 * 256) + 24 * 128 * 256


def _spec(raw: dict, name: str = "test"):
    return read_model(copy.deepcopy(raw), name, f"{name}/config.json")


def _groups(layout) -> dict:
    return {g.kind: g for g in layout.groups}


# ------------------------------------------------------------------ Falcon-H1: attention and Mamba2 in parallel


def test_falcon_h1_every_layer_keeps_kv_and_a_mamba2_state():
    spec = _spec(FALCON_H1_7B)
    assert len(spec.layers) == H1_LAYERS  # decoder layers, not cache layers
    assert all(layer.kind == "full" and layer.parallel is not None for layer in spec.layers)
    layout = build_layout(spec)
    groups = _groups(layout)
    assert sorted(groups) == ["full", "state"]
    assert groups["full"].num_layers == groups["state"].num_layers == H1_LAYERS
    assert layout.bytes_per_token == H1_LAYERS * H1_KV_PER_TOKEN_PER_LAYER == 45_056
    assert H1_STATE_ELEMS == 797_184
    assert layout.state_bytes == H1_LAYERS * H1_STATE_ELEMS * BF16 == 70_152_192  # the ~70 MB a sequence keeps
    assert layout.kv_bytes(1000) == 1000 * 45_056 + 70_152_192


def test_falcon_h1_parameters_count_both_mixers():
    hidden, heads, kv, head_dim = 3072, 12, 2, 128
    embeddings = 2 * 130048 * hidden  # untied input and output embeddings
    attention = hidden * head_dim * (2 * heads + 2 * kv)  # q and o, k and v
    d_ssm, groups, d_state, m_heads = 3072, 1, 256, 24
    mamba = hidden * (2 * d_ssm + 2 * groups * d_state + m_heads) + d_ssm * hidden  # in_proj (z, x, B, C, dt), out_proj
    mlp = 3 * hidden * 12288  # gate, up, down
    weights = estimate_weights(_spec(FALCON_H1_7B))
    assert weights.params == embeddings + H1_LAYERS * (attention + mamba + mlp) == 7_584_448_512
    parts = {kind: params for kind, params, _ in weights.components}
    assert parts["state"] == H1_LAYERS * mamba == 1_318_158_336  # what a reader without the Mamba branch misses
    assert parts["attention"] == H1_LAYERS * attention
    assert weights.kv_proj_bytes == H1_LAYERS * 2 * hidden * kv * head_dim * BF16


def test_falcon_h1_tensor_parallel_splits_kv_heads_and_state():
    layout = build_layout(_spec(FALCON_H1_7B), tp=2)
    assert layout.bytes_per_token == H1_LAYERS * 2 * 1 * 128 * BF16  # one KV head per GPU
    assert layout.state_bytes == H1_LAYERS * (H1_STATE_ELEMS // 2) * BF16


def test_falcon_h1_vllm_kv_groups():
    """44 attention and 44 Mamba cache layers: groups of 44, one of each kind; the attention block
    grows to the fewest multiple of 16 tokens whose page holds one layer's Mamba state."""
    groups = kv_groups(build_layout(_spec(FALCON_H1_7B)), block_size=16)
    state_page = H1_STATE_ELEMS * BF16  # 1,594,368 B
    block = 16 * -(-state_page // (16 * H1_KV_PER_TOKEN_PER_LAYER))
    assert block == 1568
    assert groups.group_size == H1_LAYERS and groups.attention_block_size == block
    assert sorted((k.kind, k.num_groups) for k in groups.kinds) == [("full", 1), ("state", 1)]
    assert groups.page == block * H1_KV_PER_TOKEN_PER_LAYER


def test_falcon_h1_mamba_width_rules():
    """transformers' FalconH1Config: a null mamba_d_ssm means mamba_expand x hidden, mamba_d_head "auto"
    means width / heads, and heads x d_head must equal the width."""
    raw = {**FALCON_H1_7B, "mamba_d_ssm": None, "mamba_expand": 2, "mamba_d_head": "auto", "mamba_n_heads": 48}
    state = _groups(build_layout(_spec(raw)))["state"]
    width, d_head = 2 * 3072, 2 * 3072 // 48
    assert state.state_elems == (4 - 1) * (width + 2 * 256) + 48 * d_head * 256
    with pytest.raises(ConfigError, match="mamba_d_head"):
        _spec({**FALCON_H1_7B, "mamba_d_head": 64})


def test_falcon_h1_crosscheck_with_transformers(tmp_path):
    """transformers' own FalconH1 cache holds, per decoder layer, the K/V kvplan counts and a Mamba2
    state of the same shape; it keeps all 4 conv columns (kvplan and vLLM keep 3) and the SSM state in
    float32. Pinned so a change on either side shows up."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from kvplan.backends.torch.crosscheck import crosscheck

    path = tmp_path / "falcon-h1" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(FALCON_H1_7B), encoding="utf-8")
    result = crosscheck(str(path), tokens=9)
    assert [r.kind for r in result.rows] == ["full", "state", "full", "state"]
    for row in result.rows:
        if row.kind == "full":
            assert row.ok and row.hf_bytes_per_token == row.kvplan_bytes_per_token == H1_KV_PER_TOKEN_PER_LAYER
            assert row.hf_tokens_held == 9
        else:
            assert row.hf_tensors == {"conv_states[0]": (1, 3072 + 2 * 256, 4), "recurrent_states[0]": (1, 24, 128, 256)}
            assert row.hf_dtypes["recurrent_states[0]"] == "float32"
            assert row.kvplan_elems == H1_STATE_ELEMS and row.hf_decode_growth == 0
            assert not row.ok and "kvplan counts 797,184" in row.note


# ------------------------------------------------------------------ MiniMax: lightning attention, fp8 MoE

# MiniMax-Text-01's layer pattern (hub config.json at revision 372fb1d: 80 layers, attn_type_list softmax on
# every 8th layer, 64 heads of 128, hidden 6144, MLP 9216, 2 experts per token); the KV-head, expert and
# vocabulary counts here only shape the test.
MINIMAX_TEXT_01_SHAPED = {
    "model_type": "minimax_text_01", "architectures": ["MiniMaxText01ForCausalLM"],
    "hidden_size": 6144, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 128, "intermediate_size": 9216, "num_local_experts": 32, "num_experts_per_tok": 2,
    "vocab_size": 200064, "max_position_embeddings": 10240000, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False, "attn_type_list": [1 if (i + 1) % 8 == 0 else 0 for i in range(80)],
}


def test_minimax_lightning_layers_keep_a_head_dim_square_per_head():
    layout = build_layout(_spec(MINIMAX_TEXT_01_SHAPED))
    groups = _groups(layout)
    assert (groups["full"].num_layers, groups["state"].num_layers) == (10, 70)
    assert layout.bytes_per_token == 10 * 2 * 8 * 128 * BF16 == 40_960  # only the softmax layers grow
    assert layout.state_bytes == 70 * 64 * 128 * 128 * BF16  # 2 MiB a lightning layer
    weights = estimate_weights(_spec(MINIMAX_TEXT_01_SHAPED))
    parts = {kind: params for kind, params, _ in weights.components}
    assert parts["state"] == 70 * 5 * 6144 * 64 * 128  # qkv (3 x inner), output gate, out_proj
    assert parts["attention"] == 10 * 6144 * 128 * (2 * 64 + 2 * 8)


def test_minimax_transformers_layer_types_spelling_reads_the_same():
    raw = {k: v for k, v in MINIMAX_TEXT_01_SHAPED.items() if k != "attn_type_list"}
    raw["model_type"] = "minimax"
    raw["layer_types"] = ["full_attention" if k else "linear_attention" for k in MINIMAX_TEXT_01_SHAPED["attn_type_list"]]
    assert build_layout(_spec(raw)).groups == build_layout(_spec(MINIMAX_TEXT_01_SHAPED)).groups


def test_minimax_attn_type_list_is_checked():
    with pytest.raises(ConfigError, match="attn_type_list"):
        _spec({**MINIMAX_TEXT_01_SHAPED, "attn_type_list": [0, 1]})


def test_minimax_m2_fp8_block_weights():
    spec = load_spec("MiniMaxAI/MiniMax-M2")
    assert build_layout(spec).bytes_per_token == 62 * 2 * 8 * 128 * BF16  # every layer softmax attention
    weights = estimate_weights(spec)
    assert weights.scheme == "fp8 block"
    fp8_bits = 8 + 32 / (128 * 128)  # a float32 scale per 128 x 128 block
    experts = 62 * 256 * 3 * 3072 * 1536
    parts = {kind: (params, size) for kind, params, size in weights.components}
    assert parts["experts"] == (experts, int(experts * fp8_bits // 8))
    assert parts["embeddings"] == (2 * 200064 * 3072, 2 * 200064 * 3072 * BF16)  # untied, 16-bit
    assert parts["router"] == (62 * 3072 * 256, 62 * 3072 * 256 * BF16)
    assert weights.active_params == weights.params - experts + 62 * 8 * 3 * 3072 * 1536


# ------------------------------------------------------------------ GLM: MoE with a shared expert, ChatGLM names


def test_glm45_moe_with_shared_expert_and_dense_first_layers():
    spec = load_spec("zai-org/GLM-4.5")
    assert build_layout(spec).bytes_per_token == 92 * 2 * 8 * 128 * BF16 == 376_832
    hidden, expert, experts, moe_layers = 5120, 1536, 160, 92 - 3
    embeddings = 2 * 151552 * hidden
    attention = 92 * hidden * 128 * (2 * 96 + 2 * 8)
    dense = 3 * 3 * hidden * 12288 + moe_layers * 3 * hidden * expert  # 3 dense layers, 1 shared expert each
    routed = moe_layers * experts * 3 * hidden * expert
    router = moe_layers * hidden * experts
    weights = estimate_weights(spec)
    assert weights.params == embeddings + attention + dense + routed + router
    assert weights.active_params == weights.params - routed + moe_layers * 8 * 3 * hidden * expert


def test_glm4_9b_chat_reads_chatglm_names():
    spec = load_spec("THUDM/glm-4-9b-chat")
    assert build_layout(spec).bytes_per_token == 40 * 2 * 2 * 128 * BF16 == 40_960  # 2 KV groups of 128
    assert spec.max_context == 131072
    hidden = 4096
    expected = 2 * 151552 * hidden + 40 * (hidden * 128 * (2 * 32 + 2 * 2) + 3 * hidden * 13696)
    assert estimate_weights(spec).params == expected


# ------------------------------------------------------------------ Granite, OLMoE, SmolLM3


def test_granite_multipliers_change_no_size():
    """Granite 3.x's multipliers (values from the hub config.json of granite-3.1-8b-instruct) scale
    activations only."""
    spec = load_spec("ibm-granite/granite-3.1-8b-instruct")
    raw = {**spec.raw, "attention_multiplier": 0.0078125, "embedding_multiplier": 12.0,
           "residual_multiplier": 0.22, "logits_scaling": 16.0}
    with_multipliers = _spec(raw)
    assert build_layout(with_multipliers).groups == build_layout(spec).groups
    assert estimate_weights(with_multipliers).params == estimate_weights(spec).params
    assert build_layout(spec).bytes_per_token == 40 * 2 * 8 * 128 * BF16 == 163_840  # float32 served as bf16
    hidden = 4096
    tied = 49155 * hidden  # shared input/output embeddings, counted once
    assert estimate_weights(spec).params == tied + 40 * (hidden * 128 * (2 * 32 + 2 * 8) + 3 * hidden * 12800)


def test_olmoe_experts():
    spec = load_spec("allenai/OLMoE-1B-7B-0924")
    assert build_layout(spec).bytes_per_token == 16 * 2 * 16 * 128 * BF16  # full MHA
    hidden = 2048
    experts = 16 * 64 * 3 * hidden * 1024
    expected = 2 * 50304 * hidden + 16 * hidden * 128 * (2 * 16 + 2 * 16) + experts + 16 * hidden * 64
    weights = estimate_weights(spec)
    assert weights.params == expected
    assert weights.active_params == expected - experts + 16 * 8 * 3 * hidden * 1024


def test_smollm3_gqa_and_tied_embeddings():
    spec = load_spec("HuggingFaceTB/SmolLM3-3B")
    assert build_layout(spec).bytes_per_token == 36 * 2 * 4 * 128 * BF16 == 73_728
    hidden = 2048
    expected = 128256 * hidden + 36 * (hidden * 128 * (2 * 16 + 2 * 4) + 3 * hidden * 11008)
    assert estimate_weights(spec).params == expected


# ------------------------------------------------------------------ Cohere2 (Command R7B, Command A): 3 sliding : 1 global


def test_command_r7b_three_sliding_layers_to_one_global():
    """Cohere2: sliding_window_pattern 4 makes layers 4, 8, ... global (no positional embedding) and the other
    three of every four keep a 4096-token window; 32 layers of 8 KV heads x 128."""
    spec = load_spec("CohereForAI/c4ai-command-r7b-12-2024")
    kinds = [layer.kind for layer in spec.layers]
    assert kinds == ["sliding", "sliding", "sliding", "full"] * 8
    assert {layer.window for layer in spec.layers if layer.kind == "sliding"} == {4096}
    layout = build_layout(spec)
    per_layer = 2 * 8 * 128 * BF16
    assert layout.bytes_per_token == 32 * per_layer == 131_072
    assert layout.kv_bytes(8192) == 8 * per_layer * 8192 + 24 * per_layer * 4096  # the window caps 24 layers
    hidden = 4096
    expected = 256000 * hidden + 32 * (hidden * 128 * (2 * 32 + 2 * 8) + 3 * hidden * 14336)  # tied embeddings
    assert estimate_weights(spec).params == expected == 8_027_897_856


def test_command_a_layout_and_vllm_groups():
    spec = load_spec("CohereForAI/c4ai-command-a-03-2025")
    groups = _groups(build_layout(spec))
    assert (groups["sliding"].num_layers, groups["full"].num_layers) == (48, 16)
    hidden = 12288
    assert estimate_weights(spec).params == 256000 * hidden + 64 * (hidden * 128 * (2 * 96 + 2 * 8) + 3 * hidden * 36864)
    kv = kv_groups(build_layout(spec), block_size=16)
    # 48 sliding and 16 full layers: groups of 16, three of the window and one full
    assert kv.group_size == 16
    assert sorted((k.kind, k.num_groups) for k in kv.kinds) == [("full", 1), ("sliding", 3)]


def test_cohere2_spellings_and_defaults():
    """transformers 5 writes the pattern back as layer_types; Cohere2Config defaults the pattern to 4 and the
    window to 4096, and computes head_dim as hidden / heads whatever the file says."""
    raw = {k: v for k, v in load_spec("CohereForAI/c4ai-command-r7b-12-2024").raw.items() if k != "_kvplan_source"}
    reference = build_layout(_spec(raw)).groups
    written_back = {k: v for k, v in raw.items() if k != "sliding_window_pattern"}
    written_back["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(32)]
    assert build_layout(_spec(written_back)).groups == reference
    bare = {k: v for k, v in raw.items() if k not in ("sliding_window_pattern", "sliding_window", "head_dim")}
    assert build_layout(_spec(bare)).groups == reference
    assert build_layout(_spec({**raw, "head_dim": 64})).groups == reference


# ------------------------------------------------------------------ Granite 4.0: Mamba2 and attention layers, MoE + shared MLP

# Granite-4.0-H-Small (catalog entry): 40 layers, attention at 5, 15, 25, 35; Mamba2 of 128 heads x 64, state 128.
G4_MAMBA_ELEMS = (4 - 1) * (8192 + 2 * 1 * 128) + 128 * 64 * 128


def test_granite_h_small_attention_on_four_layers_and_mamba2_state():
    spec = load_spec("ibm-granite/granite-4.0-h-small")
    attention = [i for i, layer in enumerate(spec.layers) if layer.kind == "full"]
    assert attention == [5, 15, 25, 35]
    assert all(layer.kind == "state" for i, layer in enumerate(spec.layers) if i not in attention)
    layout = build_layout(spec)
    assert layout.bytes_per_token == 4 * 2 * 8 * 128 * BF16 == 16_384
    assert G4_MAMBA_ELEMS == 1_073_920
    assert layout.state_bytes == 36 * G4_MAMBA_ELEMS * BF16 == 77_322_240


def test_granite_h_small_parameters():
    hidden, vocab = 4096, 100352
    attention = 4 * hidden * 128 * (2 * 32 + 2 * 8)
    d_inner = 2 * hidden
    mamba = 36 * (hidden * (d_inner + (d_inner + 2 * 128) + 128) + d_inner * hidden)  # in_proj (z, xBC, dt), out_proj
    experts = 40 * 72 * 3 * hidden * 768
    shared = 40 * 3 * hidden * 1536  # the gated shared MLP beside the experts, on every layer
    router = 40 * hidden * 72
    weights = estimate_weights(load_spec("ibm-granite/granite-4.0-h-small"))
    assert weights.params == vocab * hidden + attention + mamba + experts + shared + router  # tied embeddings
    assert weights.active_params == weights.params - experts + 40 * 10 * 3 * hidden * 768
    parts = {kind: params for kind, params, _ in weights.components}
    assert parts["state"] == mamba and parts["experts"] == experts and parts["mlp"] == shared


def test_granite_h_small_vllm_kv_groups():
    """4 attention and 36 Mamba layers: groups of 4 (one attention group, nine Mamba groups); the attention
    block grows to the fewest multiple of 16 tokens whose page holds one layer's Mamba state."""
    kv = kv_groups(build_layout(load_spec("ibm-granite/granite-4.0-h-small")), block_size=16)
    per_token_layer = 2 * 8 * 128 * BF16
    block = 16 * -(-(G4_MAMBA_ELEMS * BF16) // (16 * per_token_layer))
    assert block == 528
    assert kv.group_size == 4 and kv.attention_block_size == block
    assert sorted((k.kind, k.num_groups) for k in kv.kinds) == [("full", 1), ("state", 9)]


def test_granite_dense_variants():
    micro_h = load_spec("ibm-granite/granite-4.0-h-micro")
    hidden = 2048
    mamba = 36 * (hidden * (4096 + (4096 + 256) + 64) + 4096 * hidden)
    expected = 100352 * hidden + 4 * hidden * 64 * (2 * 32 + 2 * 8) + mamba + 40 * 3 * hidden * 8192
    assert estimate_weights(micro_h).params == expected
    micro = load_spec("ibm-granite/granite-4.0-micro")  # the same class, every layer attention
    assert [layer.kind for layer in micro.layers] == ["full"] * 40
    assert build_layout(micro).bytes_per_token == 40 * 2 * 8 * 64 * BF16 == 81_920
    hidden = 2560
    assert estimate_weights(micro).params == 100352 * hidden + 40 * (hidden * 64 * (2 * 40 + 2 * 8) + 3 * hidden * 8192)


def test_granite_layer_type_spellings():
    """transformers 5 writes the hub's "mamba" / "attention" back as "linear_attention" / "full_attention"; both
    read the same. Absent, every layer is Mamba2 (GraniteMoeHybridConfig's default)."""
    raw = {k: v for k, v in load_spec("ibm-granite/granite-4.0-h-tiny").raw.items() if k != "_kvplan_source"}
    renamed = {"mamba": "linear_attention", "attention": "full_attention"}
    written_back = {**raw, "layer_types": [renamed[t] for t in raw["layer_types"]]}
    assert build_layout(_spec(written_back)).groups == build_layout(_spec(raw)).groups
    assert {layer.kind for layer in _spec({k: v for k, v in raw.items() if k != "layer_types"}).layers} == {"state"}
    with pytest.raises(ConfigError, match="layer_types"):
        _spec({**raw, "layer_types": ["mamba", "moe"] * 20})
    with pytest.raises(ConfigError, match="mamba_d_head"):
        _spec({**raw, "mamba_d_head": 32})


# ------------------------------------------------------------------ the new families against transformers' own modules

CROSSCHECKED = [
    "CohereForAI/c4ai-command-r7b-12-2024", "CohereForAI/c4ai-command-a-03-2025", "ibm-granite/granite-4.0-h-small",
    "ibm-granite/granite-4.0-h-tiny", "ibm-granite/granite-4.0-h-micro", "ibm-granite/granite-4.0-micro",
]


@pytest.mark.parametrize("hub_id", CROSSCHECKED)
def test_catalog_entry_matches_transformers_on_the_meta_device(hub_id):
    """transformers builds the model from the catalog entry without weights; its parameter count (kvplan leaves out
    norms, biases, the Mamba conv1d, A, D and dt_bias, well under 0.1%) and its layer types agree with kvplan's."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    spec = load_spec(hub_id)
    raw = {k: v for k, v in spec.raw.items() if k not in ("_kvplan_source", "model_type")}
    cfg = transformers.AutoConfig.for_model(spec.model_type, **raw)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    hf_params = sum(p.numel() for p in model.parameters())
    assert abs(estimate_weights(spec).params / hf_params - 1) < 1e-3
    kind = {"full_attention": "full", "sliding_attention": "sliding", "linear_attention": "state"}
    assert [kind[t] for t in cfg.layer_types] == [layer.kind for layer in spec.layers]
    if spec.model_type == "cohere2":
        assert cfg.sliding_window == 4096 and cfg.head_dim == spec.layers[0].head_dim
