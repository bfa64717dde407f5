"""Read a Hugging Face config.json (any family) into a ModelSpec: per-layer facts about the KV cache.

Only data is read: no code from the config is ever imported or executed (no trust_remote_code).
Families name the same fact differently; the alias tables below map every spelling we know of to
one meaning. This module holds the generic attention fields (layers, heads, KV heads, head_dim,
context, dtype, sliding windows and chunked attention, per-layer `layer_types`) and chooses, per
family, the rules of kvplan/model/families/ that decide which layers keep per-token KV, a window
of it, a latent (MLA) or a constant recurrent state (Mamba, gated DeltaNet, lightning attention).
ModelSpec and LayerSpec are in kvplan/model/spec.py, the typed reader in config_reader.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvplan.errors import ConfigError
from kvplan.fileio import load_json, read_limited
from kvplan.model.config_reader import MAX_VALUE, ConfigReader
from kvplan.model.dtypes import CONFIG_DTYPE_NAMES
from kvplan.model.families.attention import block_config_layers, mla_layers
from kvplan.model.families.linear_attention import gated_deltanet_state, lightning_state, minimax_layers
from kvplan.model.families.mamba import falcon_h1_layers, granite_hybrid_layers, jamba_layers, nemotron_h_layers
from kvplan.model.spec import LayerSpec, ModelSpec

LAYERS_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")
HEADS_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
CONTEXT_KEYS = (  # vLLM's (possible_keys in vllm/config/model.py), and GPT-2's n_ctx
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
    "n_ctx",
)
# RoPE types whose context field already counts the scaling (vLLM leaves them unscaled)
SCALED_IN_CONTEXT = ("su", "longrope", "llama3")
MAX_LAYERS = 10_000  # the deepest models have a few hundred layers
MAX_CONFIG_BYTES = 16 * 2**20
# transformers' own class defaults, used when a config leaves the context out.
DEFAULT_CONTEXT = {"RefinedWebModel": 2048, "RefinedWeb": 2048, "falcon": 2048, "gpt2": 1024}


def load_config(path: Path) -> dict[str, Any]:
    """Parse a config.json file into a dict, with one-line errors (see kvplan/fileio.py)."""
    data = read_limited(path, MAX_CONFIG_BYTES, ConfigError, what="a model config")
    raw = load_json(data, path, ConfigError)
    if not isinstance(raw, dict):
        raise ConfigError("expected a JSON object at the top level", file=path)
    return raw


def read_model(raw: dict[str, Any], name: str, source: str) -> ModelSpec:
    """Turn a config dict into a ModelSpec; nested `text_config` (multimodal) is followed."""
    top = ConfigReader(raw, source)
    cfg = top.sub("text_config") if isinstance(raw.get("text_config"), dict) else top
    model_type = str(cfg.raw.get("model_type") or raw.get("model_type") or "unknown")
    dtype, note = _dtype(cfg, top)
    num_layers = cfg.int(*LAYERS_KEYS, maximum=MAX_LAYERS)
    hidden = cfg.int(*HIDDEN_KEYS)
    heads = cfg.int(*HEADS_KEYS)
    # Read whichever context field exists; a config with none (BLOOM: ALiBi has no position limit)
    # is fine as long as the caller says how many tokens (`kvplan size --tokens`).
    context = _context(cfg, model_type, str(raw.get("model_type") or ""))
    layers = _layers(cfg, model_type, num_layers, hidden, heads, context or MAX_VALUE)
    vocab = cfg.int("vocab_size", "padded_vocab_size")
    tie = cfg.bool("tie_word_embeddings", default=_ties_by_default(model_type))
    spec_raw = cfg.raw
    for key in ("quantization_config", "vision_config"):  # where the hub puts them: beside text_config
        if cfg is not top and key in raw and key not in spec_raw:
            spec_raw = {**spec_raw, key: raw[key]}
    return ModelSpec(
        name=name,
        source=source,
        model_type=model_type,
        dtype=dtype,
        dtype_note=note,
        max_context=context,
        hidden_size=hidden,
        num_heads=heads,
        vocab_size=vocab,
        tie_embeddings=tie,
        layers=tuple(layers),
        raw=spec_raw,
    )


def _ties_by_default(model_type: str) -> bool:
    # transformers' PretrainedConfig defaults tie_word_embeddings to True; these families untie
    # their own defaults in their config classes (GraniteConfig, GraniteMoe*Config and
    # FalconH1Config default it to False; the Granite checkpoints set it to true).
    return model_type not in {"llama", "mistral", "mixtral", "qwen3_next", "deepseek_v3", "granite", "granitemoe",
                              "granitemoeshared", "granitemoehybrid", "falcon_h1"}


def _dtype(cfg: ConfigReader, top: ConfigReader) -> tuple[str, str]:
    value = cfg.raw.get("torch_dtype") or cfg.raw.get("dtype")
    value = value or top.raw.get("torch_dtype") or top.raw.get("dtype")
    # vLLM's dtype auto (vllm/config/model.py, _get_and_verify_dtype and _resolve_auto_dtype): a
    # config without a dtype is read from the checkpoint's weights, else taken as float32, and float32
    # is served in the platform's first supported dtype: bf16 on GPUs that have it, fp16 on older ones
    # (V100). Two bytes either way, so the KV and weight bytes do not depend on which.
    if value is None:
        return "bf16", "no torch_dtype in config: served as bf16, vLLM's dtype auto on GPUs with bf16 (fp16 on V100)"
    name = CONFIG_DTYPE_NAMES.get(str(value).removeprefix("torch."))
    if name is None:
        raise ConfigError(f"unknown dtype {value!r}", file=cfg.source, field="torch_dtype")
    if name == "fp32":
        return "bf16", "config is float32: served as bf16, vLLM's dtype auto on GPUs with bf16 (fp16 on V100)"
    return name, ""


def _attention_config(cfg: ConfigReader) -> ConfigReader:
    return cfg.sub("attn_config") if isinstance(cfg.raw.get("attn_config"), dict) else cfg


def _num_kv_heads(cfg: ConfigReader, model_type: str, heads: int) -> int:
    """KV heads: GQA counts under their many names, MQA flags, else MHA."""
    if model_type == "mpt":
        attn = _attention_config(cfg)
        return attn.int("kv_n_heads", default=heads)
    if model_type in ("RefinedWebModel", "RefinedWeb", "falcon"):
        if cfg.bool("new_decoder_architecture"):
            return cfg.int("num_kv_heads", "n_head_kv", "num_key_value_heads")
        return 1 if cfg.bool("multi_query") else heads
    if model_type == "gpt_bigcode":
        return 1 if cfg.bool("multi_query", default=True) else heads
    if model_type == "chatglm":
        if cfg.bool("multi_query_attention"):
            return cfg.int("multi_query_group_num")
        return heads
    if cfg.has("num_key_value_heads"):
        return cfg.int("num_key_value_heads")
    if cfg.has("num_kv_heads") or cfg.has("n_head_kv"):
        return cfg.int("num_kv_heads", "n_head_kv")
    if cfg.bool("multi_query"):
        return 1
    return heads


def _head_dim(cfg: ConfigReader, model_type: str, hidden: int, heads: int) -> int:
    # Cohere2Config sets head_dim = hidden / heads whatever the file says, and vLLM's
    # CohereAttention computes it the same way.
    explicit = None if model_type == "cohere2" else cfg.opt_int("head_dim", "kv_channels", "attention_head_dim")
    if explicit is not None:
        return explicit
    if hidden % heads:
        raise ConfigError(
            f"hidden size {hidden} is not divisible by {heads} heads; set head_dim",
            file=cfg.source,
            field="head_dim",
        )
    return hidden // heads


def _layers(
    cfg: ConfigReader, model_type: str, num_layers: int, hidden: int, heads: int, context: int
) -> list[LayerSpec]:
    if cfg.has("kv_lora_rank"):
        return mla_layers(cfg, num_layers)
    kv_heads = _num_kv_heads(cfg, model_type, heads)
    head_dim = _head_dim(cfg, model_type, hidden, heads)
    full = LayerSpec("full", kv_heads, head_dim, head_dim)
    if model_type == "nemotron-nas" or cfg.has("block_configs"):
        return block_config_layers(cfg, heads, head_dim, num_layers)
    if cfg.has("hybrid_override_pattern") or model_type == "nemotron_h":
        return nemotron_h_layers(cfg, full, num_layers)
    if cfg.has("attn_layer_period") or model_type == "jamba":
        return jamba_layers(cfg, full, hidden, num_layers)
    if model_type == "falcon_h1":
        return falcon_h1_layers(cfg, full, hidden, num_layers)
    if model_type == "granitemoehybrid":
        return granite_hybrid_layers(cfg, full, hidden, num_layers)
    if cfg.has("attn_type_list"):  # MiniMax-Text-01 / M1 / M2 (remote code): 0 = lightning, 1 = softmax
        return minimax_layers(cfg, full, heads, head_dim, num_layers)
    types = _layer_types(cfg, model_type, num_layers)
    windows = _windows(cfg, model_type, context)
    layers = []
    for i, kind in enumerate(types):
        if kind == "full_attention":
            layers.append(full)
        elif kind in ("sliding_attention", "chunked_attention"):
            window = windows.get(kind)
            layers.append(full if window is None else LayerSpec("sliding", kv_heads, head_dim, head_dim, window=window))
        elif kind == "linear_attention":
            layers.append(lightning_state(heads, head_dim) if model_type.startswith("minimax")
                          else gated_deltanet_state(cfg))
        else:
            raise ConfigError(
                f"unknown layer type {kind!r} at layer {i}", file=cfg.source, field="layer_types"
            )
    return layers


def _layer_types(cfg: ConfigReader, model_type: str, num_layers: int) -> list[str]:
    """The attention type of each layer, from layer_types or the family's pattern keys."""
    explicit = cfg.raw.get("layer_types")
    if explicit is not None:
        if not isinstance(explicit, list) or len(explicit) != num_layers:
            raise ConfigError(
                f"expected a list of {num_layers} layer types", file=cfg.source, field="layer_types"
            )
        return [str(t) for t in explicit]
    if cfg.has("full_attention_interval"):  # Qwen3-Next: every Nth layer is full attention
        every = cfg.int("full_attention_interval")
        return ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(num_layers)]
    if cfg.has("sliding_window_pattern"):  # Gemma 3: every Nth layer is global
        every = cfg.int("sliding_window_pattern")
        return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(num_layers)]
    if model_type == "cohere2":  # Cohere2Config: sliding_window_pattern (default 4), every Nth layer global
        every = cfg.int("sliding_window_pattern", "_sliding_window_pattern", default=4)
        return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(num_layers)]
    if model_type == "gemma2":  # Gemma 2 alternates, sliding first
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
    if cfg.has("attention_chunk_size"):  # Llama 4: RoPE layers attend within chunks
        no_rope = cfg.raw.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(num_layers)]
        if not isinstance(no_rope, list) or len(no_rope) != num_layers:
            raise ConfigError(f"expected a list of {num_layers} flags", file=cfg.source, field="no_rope_layers")
        return ["chunked_attention" if use_rope else "full_attention" for use_rope in no_rope]
    if cfg.has("sliding_window") and cfg.bool("use_sliding_window", default=_window_on_by_default(model_type)):
        first = cfg.int("max_window_layers", default=0, positive=False) if model_type.startswith("qwen") else 0
        return ["full_attention" if i < first else "sliding_attention" for i in range(num_layers)]
    return ["full_attention"] * num_layers


def _window_on_by_default(model_type: str) -> bool:
    """transformers' Qwen2/Qwen3 configs default use_sliding_window to false; other families have no switch."""
    return not model_type.startswith("qwen")


def _context(cfg: ConfigReader, model_type: str, top_type: str) -> int | None:
    """The context vLLM derives as the default max_model_len (vllm/config/model.py,
    `_get_and_verify_max_len`): the smallest context field present, times the RoPE scaling
    factor (`rope_parameters`, or `rope_scaling` before transformers 5; a yarn one scales its
    `original_max_position_embeddings`), except for the RoPE types whose field already counts it
    (su, longrope, llama3) and Gemma 3, whose 128K does too. None: the config states none."""
    present = [cfg.int(key) for key in CONTEXT_KEYS if cfg.has(key)]
    if not present:
        return DEFAULT_CONTEXT.get(model_type) or None
    context = min(present)
    key = next((k for k in ("rope_parameters", "rope_scaling") if cfg.has(k)), None)
    if key is None or "gemma3" in model_type or "gemma3" in top_type:
        return context
    rope = cfg.sub(key)
    nested = bool(rope.raw) and all(isinstance(v, dict) for v in rope.raw.values())  # one per layer type
    factor = 1.0
    for group in ([rope.sub(k) for k in rope.raw] if nested else [rope]):
        kind = group.raw.get("rope_type", group.raw.get("type", "default"))
        if not isinstance(kind, str):
            raise ConfigError(f"expected a string, got {kind!r}", file=cfg.source,
                              field=group.prefix + ("rope_type" if "rope_type" in group.raw else "type"))
        if kind in SCALED_IN_CONTEXT:
            continue
        factor = group.number("factor", default=factor)
        if kind == "yarn":
            context = group.int("original_max_position_embeddings")
    scaled = int(context * factor)
    if not 1 <= scaled <= MAX_VALUE:
        raise ConfigError(f"expected a factor that keeps the context from 1 to {MAX_VALUE:,}, got {factor:g}",
                          file=cfg.source, field=f"{key}.factor")
    return scaled


def _windows(cfg: ConfigReader, model_type: str, context: int) -> dict[str, int | None]:
    """Window per layer type; a window that is off or at least the context is no window."""
    sliding = None
    if cfg.has("sliding_window") and cfg.bool("use_sliding_window", default=_window_on_by_default(model_type)):
        sliding = cfg.int("sliding_window")
    elif model_type == "cohere2" and "sliding_window" not in cfg.raw:
        sliding = 4096  # Cohere2Config's default window
    chunk = cfg.opt_int("attention_chunk_size")
    out: dict[str, int | None] = {}
    for kind, window in (("sliding_attention", sliding), ("chunked_attention", chunk)):
        out[kind] = window if window is not None and window < context else None
    return out
