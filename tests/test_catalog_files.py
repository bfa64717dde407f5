"""The bundled model catalog, models/<org>/<name>/config.json.

The first group of tests needs nothing outside the repository. The last group compares each catalog
entry with the published config of the same model in the shared corpus (../shared/hf-configs next to
the repository, or $KVPLAN_SHARED) and is skipped when that corpus is absent.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "models"
SOURCE_KEY = "_kvplan_source"


def _strict_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name}")


def _load_catalog() -> dict[str, dict]:
    out = {}
    for path in sorted(MODELS.glob("*/*/config.json")):
        hub_id = f"{path.parent.parent.name}/{path.parent.name}"
        out[hub_id] = json.loads(path.read_text(encoding="utf-8"), parse_constant=_strict_constant)
    return out


CATALOG = _load_catalog()
IDS = sorted(CATALOG)

# The 40 models of the shared corpus plus the ones the planner's documentation leans on. Spelled out so
# that this list is checked without the corpus.
REQUIRED_IDS = {
    "CohereForAI/c4ai-command-r-v01", "Qwen/Qwen2-7B-Instruct", "Qwen/Qwen2.5-3B-Instruct", "Qwen/Qwen3-0.6B",
    "Qwen/Qwen3-235B-A22B", "Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-32B", "Qwen/Qwen3-Next-80B-A3B-Instruct",
    "THUDM/chatglm2-6b", "bigcode/starcoder2-7b", "bigcode/starcoderbase-7b", "deepseek-ai/DeepSeek-V2-Lite",
    "deepseek-ai/DeepSeek-V3", "google/gemma-2-2b-it", "google/gemma-2-9b-it", "google/gemma-3-1b-it",
    "meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-7b-hf", "meta-llama/Llama-3.2-1B-Instruct",
    "meta-llama/Llama-3.2-3B-Instruct", "meta-llama/Llama-4-Maverick-17B-128E-Instruct",
    "meta-llama/Llama-4-Scout-17B-16E-Instruct", "meta-llama/Meta-Llama-3-70B-Instruct",
    "meta-llama/Meta-Llama-3.1-405B", "meta-llama/Meta-Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-8B",
    "microsoft/Phi-3.5-mini-instruct", "microsoft/Phi-4-mini-instruct", "mistralai/Mistral-7B-Instruct-v0.3",
    "mistralai/Mixtral-8x7B-v0.1", "moonshotai/Kimi-K2-Instruct", "mosaicml/mpt-7b",
    "nvidia/Llama-3_3-Nemotron-Super-49B-v1", "nvidia/Nemotron-H-56B-Base-8K", "openai/gpt-oss-120b",
    "openai/gpt-oss-20b", "openai-community/gpt2", "tiiuae/falcon-180B", "tiiuae/falcon-40b", "tiiuae/falcon-7b",
    # not in the shared corpus
    "meta-llama/Meta-Llama-3-8B", "meta-llama/Meta-Llama-3-70B", "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/Llama-2-13b-hf", "mistralai/Mistral-7B-v0.1", "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen2.5-72B-Instruct", "google/gemma-3-27b-it", "ai21labs/Jamba-v0.1", "deepseek-ai/DeepSeek-R1",
    "facebook/opt-6.7b", "facebook/opt-13b", "facebook/opt-66b",
}

# Keys every config of a family must hold (a tuple means "one of these"). Checked on text_config where
# the model nests one.
_DECODER = ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "max_position_embeddings"]
_GQA = [*_DECODER, "num_key_value_heads", "intermediate_size"]
_MLA = ["kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "n_routed_experts",
        "n_shared_experts", "moe_intermediate_size", "first_k_dense_replace", "num_experts_per_tok"]
FAMILY_KEYS: dict[str, list] = {
    "llama": _GQA,
    "mistral": [*_GQA, "sliding_window"],
    "mixtral": [*_GQA, "num_local_experts", "num_experts_per_tok"],
    "qwen2": [*_GQA, "sliding_window", "use_sliding_window", "max_window_layers"],
    "qwen3": [*_GQA, "head_dim", "use_sliding_window"],
    "qwen3_moe": [*_GQA, "head_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size"],
    "qwen3_next": [*_GQA, "head_dim", "full_attention_interval", "linear_num_key_heads", "linear_num_value_heads",
                   "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "num_experts",
                   "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"],
    "gemma2": [*_GQA, "head_dim", "sliding_window"],
    "gemma3_text": [*_GQA, "head_dim", "sliding_window", "sliding_window_pattern"],
    "llama4_text": [*_GQA, "head_dim", "num_local_experts", "num_experts_per_tok", "interleave_moe_layer_step",
                    "attention_chunk_size", "intermediate_size_mlp"],
    "phi3": [*_GQA, "original_max_position_embeddings"],
    "cohere": _GQA,
    "starcoder2": [*_GQA, "sliding_window"],
    "gpt_oss": [*_GQA, "head_dim", "sliding_window", "layer_types", "num_local_experts", "num_experts_per_tok"],
    "deepseek_v2": [*_GQA, *_MLA],
    "deepseek_v3": [*_GQA, *_MLA],
    "kimi_k2": [*_GQA, *_MLA],
    "jamba": [*_GQA, "attn_layer_period", "attn_layer_offset", "expert_layer_period", "expert_layer_offset",
              "num_experts", "num_experts_per_tok", "mamba_d_state", "mamba_d_conv", "mamba_expand"],
    "nemotron_h": [*_GQA, "hybrid_override_pattern", "attention_head_dim", "mamba_num_heads", "mamba_head_dim",
                   "ssm_state_size", "n_groups", "conv_kernel", "expand"],
    "nemotron-nas": [*_DECODER, "num_key_value_heads", "block_configs"],
    "falcon": ["hidden_size", "vocab_size", ("num_hidden_layers", "n_layer"), ("num_attention_heads", "n_head"),
               ("num_kv_heads", "multi_query"), "new_decoder_architecture"],
    "RefinedWebModel": ["hidden_size", "vocab_size", "n_layer", "n_head", "multi_query"],
    "gpt2": ["n_embd", "n_layer", "n_head", "n_positions", "vocab_size"],
    "gpt_bigcode": ["n_embd", "n_layer", "n_head", "n_positions", "n_inner", "multi_query", "vocab_size"],
    "mpt": ["d_model", "n_layers", "n_heads", "max_seq_len", "expansion_ratio", "attn_config", "vocab_size"],
    "chatglm": ["hidden_size", "num_layers", "num_attention_heads", "multi_query_attention", "multi_query_group_num",
                "kv_channels", "ffn_hidden_size", "padded_vocab_size", "seq_length"],
    "opt": [*_DECODER, "ffn_dim", "word_embed_proj_dim", "do_layer_norm_before"],
    "glm4_moe": [*_GQA, "head_dim", "n_routed_experts", "n_shared_experts", "moe_intermediate_size",
                 "first_k_dense_replace", "num_experts_per_tok"],
    "olmo2": _GQA,
    "olmoe": [*_GQA, "num_experts", "num_experts_per_tok"],
    "granite": _GQA,
    "cohere2": [*_GQA, "sliding_window", ("sliding_window_pattern", "layer_types")],
    "granitemoehybrid": [*_GQA, "layer_types", "num_local_experts", "shared_intermediate_size"],
    "smollm3": _GQA,
    "minimax_m2": [*_GQA, "head_dim", "num_local_experts", "num_experts_per_tok"],
}
NESTED_FAMILIES = {"gemma3": "gemma3_text", "llama4": "llama4_text"}

# Models whose published config sets no torch_dtype (the catalog keeps to the hub file).
NO_DTYPE = {"openai-community/gpt2", "openai/gpt-oss-20b", "openai/gpt-oss-120b", "MiniMaxAI/MiniMax-M2"}


def _text(cfg: dict) -> dict:
    return cfg.get("text_config", cfg)


def _first(cfg: dict, *names):
    for name in names:
        if name in cfg:
            return cfg[name]
    return None


# --------------------------------------------------------------------------- repository-only tests


def test_catalog_size_and_required_entries():
    assert len(CATALOG) >= 34
    missing = REQUIRED_IDS - set(CATALOG)
    assert not missing, f"catalog lacks {sorted(missing)}"


def test_catalog_layout_is_org_name_config_json():
    for path in MODELS.rglob("config.json"):
        rel = path.relative_to(MODELS)
        assert len(rel.parts) == 3, f"{rel}: expected models/<org>/<name>/config.json"
    for path in MODELS.rglob("*"):
        if path.is_file():
            assert path.name in {"config.json", "README.md"}, f"stray file {path.relative_to(REPO)}"


@pytest.mark.parametrize("hub_id", IDS)
def test_entry_has_family_keys_and_source(hub_id):
    cfg = CATALOG[hub_id]
    source = cfg.get(SOURCE_KEY)
    assert isinstance(source, str) and len(source) >= 20, f"{hub_id}: {SOURCE_KEY} missing or too short"
    assert isinstance(cfg.get("model_type"), str)
    archs = cfg.get("architectures")
    assert isinstance(archs, list) and archs and all(isinstance(a, str) for a in archs)

    model_type = cfg["model_type"]
    if model_type in NESTED_FAMILIES:
        assert isinstance(cfg.get("text_config"), dict), f"{hub_id}: {model_type} keeps its text_config"
        text = cfg["text_config"]
        assert text.get("model_type") == NESTED_FAMILIES[model_type]
        family = text["model_type"]
    else:
        assert "text_config" not in cfg
        text, family = cfg, model_type
    assert family in FAMILY_KEYS, f"{hub_id}: unknown family {family!r}"
    for key in FAMILY_KEYS[family]:
        names = key if isinstance(key, tuple) else (key,)
        assert any(name in text for name in names), f"{hub_id}: needs {' or '.join(names)}"

    dtype = cfg.get("torch_dtype", text.get("torch_dtype"))
    if hub_id in NO_DTYPE:
        assert dtype is None
    else:
        assert dtype in {"float32", "float16", "bfloat16"}, f"{hub_id}: torch_dtype {dtype!r}"


@pytest.mark.parametrize("hub_id", IDS)
def test_entry_values_are_consistent(hub_id):
    cfg = CATALOG[hub_id]
    text = _text(cfg)
    layers = _first(text, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    heads = _first(text, "num_attention_heads", "n_head", "n_heads")
    hidden = _first(text, "hidden_size", "n_embd", "d_model")
    vocab = _first(text, "vocab_size", "padded_vocab_size")
    for name, value in [("layers", layers), ("heads", heads), ("hidden", hidden), ("vocab", vocab)]:
        assert isinstance(value, int) and not isinstance(value, bool) and value > 0, f"{hub_id}: {name}={value!r}"

    head_dim = _first(text, "head_dim", "kv_channels", "attention_head_dim")
    if head_dim is None and "kv_lora_rank" not in text:
        assert hidden % heads == 0, f"{hub_id}: hidden {hidden} not divisible by {heads} heads"
    kv = _first(text, "num_key_value_heads", "num_kv_heads", "multi_query_group_num")
    if kv is not None:
        assert heads % kv == 0, f"{hub_id}: {heads} heads do not split into {kv} KV groups"

    context = _first(text, "max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
    if context is not None:
        assert context >= 1024
    window = text.get("sliding_window")
    if window is not None:
        assert isinstance(window, int) and window > 0

    if "layer_types" in text:
        assert len(text["layer_types"]) == layers
        if text.get("model_type") == "granitemoehybrid":  # each layer's mixer, as the Granite 4.0 hub files name it
            assert set(text["layer_types"]) <= {"mamba", "attention"} and "attention" in text["layer_types"]
        else:
            assert set(text["layer_types"]) <= {"sliding_attention", "full_attention"}
    if "block_configs" in text:
        assert len(text["block_configs"]) == layers
        attending = [b for b in text["block_configs"] if not b["attention"]["no_op"]]
        assert attending and all(heads % b["attention"]["n_heads_in_group"] == 0 for b in attending)
    if "hybrid_override_pattern" in text:
        pattern = text["hybrid_override_pattern"]
        assert len(pattern) == layers and set(pattern) <= {"M", "*", "-", "E"} and "*" in pattern
    if "attn_layer_period" in text:
        assert 0 <= text["attn_layer_offset"] < text["attn_layer_period"] <= layers
    if "kv_lora_rank" in text:
        assert text["kv_lora_rank"] > 0 and text["qk_rope_head_dim"] > 0


def test_catalog_files_are_strict_json_in_our_own_layout():
    for hub_id in IDS:
        path = MODELS / hub_id / "config.json"
        raw = path.read_text(encoding="utf-8")
        assert raw.endswith("\n")
        assert "Infinity" not in raw and "NaN" not in raw
        assert "_name_or_path" not in raw and "transformers_version" not in raw


def test_one_falcon_keeps_the_old_refinedweb_names():
    falcons = {k: v for k, v in CATALOG.items() if k.startswith("tiiuae/falcon")}
    old = [k for k, v in falcons.items() if "n_head" in v and "n_layer" in v and "num_attention_heads" not in v]
    new = [k for k, v in falcons.items() if "num_attention_heads" in v and "n_head" not in v]
    assert old and new


def _kv_bytes_per_token(cfg: dict, bytes_per_elem: int = 2) -> int:
    text = _text(cfg)
    layers = _first(text, "num_hidden_layers", "n_layer")
    heads = _first(text, "num_attention_heads", "n_head")
    kv = _first(text, "num_key_value_heads") or heads
    head_dim = text.get("head_dim") or _first(text, "hidden_size") // heads
    return 2 * layers * kv * head_dim * bytes_per_elem


def test_required_llama3_8b_values():
    cfg = CATALOG["meta-llama/Meta-Llama-3-8B"]
    assert cfg["model_type"] == "llama"
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (32, 32, 8)
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]) == (4096, 14336, 128256)
    assert cfg["max_position_embeddings"] == 8192
    assert cfg["torch_dtype"] == "bfloat16"
    assert cfg["rope_theta"] == 500000
    assert _kv_bytes_per_token(cfg) == 131_072  # 128 KiB, the lesson's figure


def test_required_opt13b_values():
    cfg = CATALOG["facebook/opt-13b"]
    assert cfg["model_type"] == "opt"
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["hidden_size"]) == (40, 40, 5120)
    assert (cfg["ffn_dim"], cfg["vocab_size"], cfg["max_position_embeddings"]) == (20480, 50272, 2048)
    assert cfg["torch_dtype"] == "float16"
    assert cfg["do_layer_norm_before"] is True and cfg["word_embed_proj_dim"] == 5120
    assert _kv_bytes_per_token(cfg) == 819_200  # Kwon et al.'s "800 KB"
    for size in ("facebook/opt-6.7b", "facebook/opt-66b"):
        assert CATALOG[size]["model_type"] == "opt"


def test_other_named_entries():
    mistral = CATALOG["mistralai/Mistral-7B-v0.1"]
    assert mistral["sliding_window"] == 4096 and mistral["max_position_embeddings"] == 32768
    gemma = CATALOG["google/gemma-3-27b-it"]["text_config"]
    assert (gemma["sliding_window"], gemma["sliding_window_pattern"]) == (1024, 6)
    assert (gemma["num_hidden_layers"], gemma["num_key_value_heads"], gemma["head_dim"]) == (62, 16, 128)
    jamba = CATALOG["ai21labs/Jamba-v0.1"]
    assert (jamba["num_hidden_layers"], jamba["attn_layer_period"], jamba["attn_layer_offset"]) == (32, 8, 4)
    assert (jamba["num_key_value_heads"], jamba["num_attention_heads"], jamba["hidden_size"]) == (8, 32, 4096)
    assert (jamba["mamba_d_state"], jamba["mamba_d_conv"], jamba["mamba_expand"]) == (16, 4, 2)
    assert (jamba["num_experts"], jamba["expert_layer_period"]) == (16, 2)
    r1 = {k: v for k, v in CATALOG["deepseek-ai/DeepSeek-R1"].items() if k != SOURCE_KEY}
    v3 = {k: v for k, v in CATALOG["deepseek-ai/DeepSeek-V3"].items() if k != SOURCE_KEY}
    assert r1 == v3
    for llama2 in ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-13b-hf", "meta-llama/Llama-2-70b-hf"):
        assert CATALOG[llama2]["max_position_embeddings"] == 4096


def _readme_ids() -> list[str]:
    text = (MODELS / "README.md").read_text(encoding="utf-8")
    ids = []
    for line in text.splitlines():
        match = re.match(r"^\|\s*`?([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)`?\s*\|", line)
        if match:
            ids.append(match.group(1))
    return ids


def test_readme_lists_every_entry_once():
    ids = _readme_ids()
    assert len(ids) == len(set(ids)), "README lists an entry twice"
    assert set(ids) == set(CATALOG), (
        f"README missing {sorted(set(CATALOG) - set(ids))}, extra {sorted(set(ids) - set(CATALOG))}"
    )
    text = (MODELS / "README.md").read_text(encoding="utf-8")
    assert "add a model" in text.lower()


# ------------------------------------------------------------ comparison with the published configs


def _shared_configs() -> Path | None:
    candidates = []
    env = os.environ.get("KVPLAN_SHARED")
    if env:
        candidates += [Path(env) / "hf-configs", Path(env)]
    candidates.append(Path(__file__).resolve().parents[2] / "shared" / "hf-configs")
    for path in candidates:
        if path.is_dir() and any(path.glob("*--*/config.json")):
            return path
    return None


SHARED = _shared_configs()
SHARED_IDS = (
    sorted(p.parent.name.replace("--", "/", 1) for p in SHARED.glob("*--*/config.json")) if SHARED else []
)

# Where the shared copy is known not to be the current hub file; (key path, shared value, catalog value, why).
KNOWN_DIFFERENCES: dict[str, list[tuple[tuple[str, ...], object, object, str]]] = {
    "meta-llama/Llama-2-7b-hf": [
        (("max_position_embeddings",), 2048, 4096, "shared copy is the July-2023 first revision; hub now 4096"),
    ],
    "meta-llama/Llama-2-70b-hf": [
        (("max_position_embeddings",), 2048, 4096, "shared copy is the July-2023 first revision; hub now 4096"),
    ],
    "mosaicml/mpt-7b": [
        (("architectures",), ["MptForCausalLM"], ["MPTForCausalLM"],
         "IPEX renamed the class in its copy; the hub file names the remote-code class"),
    ],
}


def _load_shared(hub_id: str) -> dict:
    path = SHARED / hub_id.replace("/", "--", 1) / "config.json"
    return json.loads(path.read_text(encoding="utf-8"))  # allows the Infinity of Nemotron-H


def _patched_real(hub_id: str) -> dict:
    real = copy.deepcopy(_load_shared(hub_id))
    for keys, shared_value, ours, _why in KNOWN_DIFFERENCES.get(hub_id, []):
        node = real
        for key in keys[:-1]:
            node = node[key]
        assert node.get(keys[-1]) == shared_value, f"{hub_id}: shared {'.'.join(keys)} changed; revisit"
        node[keys[-1]] = ours
    return real


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
    return type(a) is type(b) and a == b


def _assert_subset(ours, real, where: str) -> None:
    """Every value the catalog holds is the published one (dicts may drop keys, never add or change)."""
    if isinstance(ours, dict):
        assert isinstance(real, dict), f"{where}: catalog has a mapping, published file has {real!r}"
        for key, value in ours.items():
            if key == SOURCE_KEY:
                continue
            assert key in real, f"{where}.{key}: not in the published config"
            _assert_subset(value, real[key], f"{where}.{key}")
    elif isinstance(ours, list):
        assert isinstance(real, list) and len(ours) == len(real), f"{where}: list differs from published"
        for i, (a, b) in enumerate(zip(ours, real)):
            _assert_subset(a, b, f"{where}[{i}]")
    else:
        assert _same(ours, real), f"{where}: catalog {ours!r} != published {real!r}"


# The architectural facts the planner reads, under whatever names the family uses.
FACTS: dict[str, tuple[str, ...]] = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "heads": ("num_attention_heads", "n_head", "n_heads"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads", "multi_query_group_num"),
    "multi_query": ("multi_query", "multi_query_attention"),
    "new_decoder_architecture": ("new_decoder_architecture",),
    "head_dim": ("head_dim", "kv_channels", "attention_head_dim"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "vocab": ("vocab_size", "padded_vocab_size"),
    "context": ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"),
    "model_max_length": ("model_max_length",),
    "original_context": ("original_max_position_embeddings",),
    "intermediate": ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size"),
    "intermediate_mlp": ("intermediate_size_mlp",),
    "expansion_ratio": ("expansion_ratio",),
    "torch_dtype": ("torch_dtype",),
    "tie_word_embeddings": ("tie_word_embeddings",),
    # sliding windows and chunked attention
    "sliding_window": ("sliding_window",),
    "use_sliding_window": ("use_sliding_window",),
    "max_window_layers": ("max_window_layers",),
    "sliding_window_pattern": ("sliding_window_pattern",),
    "layer_types": ("layer_types",),
    "attention_chunk_size": ("attention_chunk_size",),
    # MoE
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "experts_per_tok": ("num_experts_per_tok",),
    "moe_intermediate": ("moe_intermediate_size",),
    "shared_experts": ("n_shared_experts",),
    "shared_expert_intermediate": ("shared_expert_intermediate_size",),
    "first_k_dense_replace": ("first_k_dense_replace",),
    "interleave_moe_layer_step": ("interleave_moe_layer_step",),
    "decoder_sparse_step": ("decoder_sparse_step",),
    # MLA
    "kv_lora_rank": ("kv_lora_rank",),
    "q_lora_rank": ("q_lora_rank",),
    "qk_rope_head_dim": ("qk_rope_head_dim",),
    "qk_nope_head_dim": ("qk_nope_head_dim",),
    "v_head_dim": ("v_head_dim",),
    "quant_method": (),  # filled in by _facts
    # linear attention and Mamba
    "full_attention_interval": ("full_attention_interval",),
    "linear_num_key_heads": ("linear_num_key_heads",),
    "linear_num_value_heads": ("linear_num_value_heads",),
    "linear_key_head_dim": ("linear_key_head_dim",),
    "linear_value_head_dim": ("linear_value_head_dim",),
    "linear_conv_kernel_dim": ("linear_conv_kernel_dim",),
    "hybrid_override_pattern": ("hybrid_override_pattern",),
    "mamba_num_heads": ("mamba_num_heads",),
    "mamba_head_dim": ("mamba_head_dim",),
    "ssm_state_size": ("ssm_state_size", "mamba_d_state"),
    "conv_kernel": ("conv_kernel", "mamba_d_conv"),
    "expand": ("expand", "mamba_expand"),
    "n_groups": ("n_groups",),
    "attn_layer_period": ("attn_layer_period",),
    "attn_layer_offset": ("attn_layer_offset",),
    "expert_layer_period": ("expert_layer_period",),
    "expert_layer_offset": ("expert_layer_offset",),
}


def _facts(cfg: dict) -> dict:
    text = _text(cfg)
    facts = {}
    for fact, names in FACTS.items():
        value = _first(text, *names)
        if value is None and fact == "torch_dtype":
            value = cfg.get("torch_dtype")
        facts[fact] = value
    quant = cfg.get("quantization_config") or {}
    facts["quant_method"] = quant.get("quant_method")
    if "block_configs" in text:
        facts["blocks"] = [
            (b["attention"]["no_op"], b["attention"]["n_heads_in_group"], b["ffn"]["no_op"], b["ffn"]["ffn_mult"])
            for b in text["block_configs"]
        ]
    attn = text.get("attn_config")
    if isinstance(attn, dict):
        facts["attn_type"] = attn.get("attn_type")
        facts["alibi"] = attn.get("alibi")
        facts["attn_kv_n_heads"] = attn.get("kv_n_heads")
    return facts


needs_shared = pytest.mark.skipif(SHARED is None, reason="shared hf-configs corpus not found (set KVPLAN_SHARED)")


@needs_shared
def test_every_shared_model_has_a_catalog_entry():
    assert len(SHARED_IDS) >= 40
    missing = set(SHARED_IDS) - set(CATALOG)
    assert not missing, f"catalog lacks {sorted(missing)}"


@needs_shared
def test_catalog_files_are_not_verbatim_copies():
    for hub_id in set(SHARED_IDS) & set(CATALOG):
        ours = (MODELS / hub_id / "config.json").read_text(encoding="utf-8")
        theirs = (SHARED / hub_id.replace("/", "--", 1) / "config.json").read_text(encoding="utf-8")
        assert ours != theirs, f"{hub_id}: catalog file is a copy"


@pytest.mark.parametrize("hub_id", [i for i in IDS if i in set(SHARED_IDS)] or ["<no shared corpus>"])
def test_matches_published_config(hub_id):
    if SHARED is None:
        pytest.skip("shared hf-configs corpus not found (set KVPLAN_SHARED)")
    ours = CATALOG[hub_id]
    real = _patched_real(hub_id)
    _assert_subset(ours, real, hub_id)
    ours_facts, real_facts = _facts(ours), _facts(real)
    for fact in sorted(set(ours_facts) | set(real_facts)):
        assert _same(ours_facts.get(fact), real_facts.get(fact)), (
            f"{hub_id}: {fact} is {ours_facts.get(fact)!r} in the catalog, {real_facts.get(fact)!r} published"
        )


@needs_shared
def test_known_differences_are_still_needed():
    for hub_id, diffs in KNOWN_DIFFERENCES.items():
        assert hub_id in CATALOG and hub_id in SHARED_IDS
        real = _load_shared(hub_id)
        for keys, shared_value, ours, why in diffs:
            assert why
            node_real, node_ours = real, CATALOG[hub_id]
            for key in keys:
                node_real, node_ours = node_real[key], node_ours[key]
            assert node_real == shared_value and node_ours == ours and shared_value != ours
