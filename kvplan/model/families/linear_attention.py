"""Linear-attention families: layers that keep a constant state per sequence instead of per-token K/V.

- MiniMax-Text-01 / M1 / M2: lightning attention, listed per layer in the remote-code configs'
  `attn_type_list` (0 lightning, 1 softmax) or in transformers' `layer_types` ("linear_attention");
  its state shape is vLLM's (mamba_utils: linear_attention_state_shape, _dtype).
- Qwen3-Next: gated DeltaNet ("linear_attention" layers), a convolution state plus one key x value
  matrix per value head.
"""

from __future__ import annotations

from kvplan.errors import ConfigError
from kvplan.model.config_reader import ConfigReader
from kvplan.model.spec import LayerSpec


def minimax_layers(cfg: ConfigReader, full: LayerSpec, heads: int, head_dim: int, num_layers: int) -> list[LayerSpec]:
    """MiniMax's remote-code configs list each layer's attention in `attn_type_list`: 1 is softmax
    attention (per-token K/V), 0 is lightning attention, a linear attention with a constant state
    (vLLM's MiniMaxText01DecoderLayer reads `attention_type` per layer the same way; transformers'
    own MiniMax config spells it as `layer_types` with "linear_attention", read in
    kvplan/model/config.py)."""
    kinds = cfg.raw.get("attn_type_list")
    if not isinstance(kinds, list) or len(kinds) != num_layers or any(k not in (0, 1) or isinstance(k, bool)
                                                                      for k in kinds):
        raise ConfigError(f"expected a list of {num_layers} attention types, each 0 (lightning) or 1 (softmax)",
                          file=cfg.source, field="attn_type_list")
    lightning = lightning_state(heads, head_dim)
    return [full if kind == 1 else lightning for kind in kinds]


def lightning_state(heads: int, head_dim: int) -> LayerSpec:
    """MiniMax lightning attention keeps one head_dim x head_dim key-value state per attention head,
    in the model dtype (vLLM mamba_utils: linear_attention_state_shape is (heads / tp, head_dim,
    head_dim), linear_attention_state_dtype the model's)."""
    return LayerSpec("state", state_elems=heads * head_dim * head_dim, state_heads=heads)


def gated_deltanet_state(cfg: ConfigReader) -> LayerSpec:
    """Qwen3-Next linear attention: a conv state plus one key x value matrix per value head."""
    k_heads, v_heads = cfg.int("linear_num_key_heads"), cfg.int("linear_num_value_heads")
    k_dim, v_dim = cfg.int("linear_key_head_dim"), cfg.int("linear_value_head_dim")
    kernel = cfg.int("linear_conv_kernel_dim", default=4)
    conv = (kernel - 1) * (2 * k_heads * k_dim + v_heads * v_dim)
    return LayerSpec("state", state_elems=conv + v_heads * k_dim * v_dim, state_heads=v_heads)
