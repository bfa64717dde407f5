"""Attention families whose per-layer K/V the generic fields do not describe.

- Multi-head latent attention (MLA: DeepSeek-V2/V3/R1, Kimi K2): a layer keeps one latent of
  kv_lora_rank + qk_rope_head_dim per token instead of per-head K and V.
- Nemotron-NAS (DeciLM, e.g. Llama-3.3-Nemotron-Super-49B): `block_configs` give every layer its
  own attention: a GQA group size, or no attention at all (no_op or replaced by a linear layer).
"""

from __future__ import annotations

from kvplan.errors import ConfigError
from kvplan.model.config_reader import ConfigReader
from kvplan.model.spec import LayerSpec


def mla_layers(cfg: ConfigReader, num_layers: int) -> list[LayerSpec]:
    latent = cfg.int("kv_lora_rank") + cfg.int("qk_rope_head_dim")
    return [LayerSpec("mla", latent_dim=latent)] * num_layers


def block_config_layers(cfg: ConfigReader, heads: int, head_dim: int, num_layers: int) -> list[LayerSpec]:
    """Nemotron-NAS (DeciLM): per-layer attention; no_op or linear-replaced layers keep nothing."""
    blocks = cfg.raw.get("block_configs")
    if not isinstance(blocks, list) or len(blocks) != num_layers:
        raise ConfigError(f"expected a list of {num_layers} blocks", file=cfg.source, field="block_configs")
    layers = []
    for i, block in enumerate(blocks):
        attn = block.get("attention") if isinstance(block, dict) else None
        if not isinstance(attn, dict):
            raise ConfigError("expected an attention object", file=cfg.source, field=f"block_configs[{i}].attention")
        if attn.get("no_op") or attn.get("replace_with_linear"):
            layers.append(LayerSpec("none"))
            continue
        group = ConfigReader(attn, cfg.source, f"block_configs[{i}].attention.").int("n_heads_in_group")
        if heads % group:
            raise ConfigError(f"expected a divisor of the {heads} attention heads, got {group}",
                              file=cfg.source, field=f"block_configs[{i}].attention.n_heads_in_group")
        layers.append(LayerSpec("full", heads // group, head_dim, head_dim))
    return layers
