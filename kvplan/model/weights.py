"""Estimate a model's weight bytes and forward FLOPs from its config (dense, MoE, MLA, hybrids).

Counts the matrices (embeddings, attention, MLP or experts, Mamba/DeltaNet projections) and leaves
out norms and biases, which are well under 0.1% of any model here. Quantized checkpoints are sized
by their `quantization_config`: fp8 linear layers at 1 byte, MXFP4 experts at 4.25 bits (4-bit
values plus one 8-bit scale per 32), GPTQ/AWQ at their stated bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvplan.model.config import LayerSpec, ModelSpec
from kvplan.model.dtypes import DTYPE_BITS

NON_GATED = {"gpt2", "opt", "falcon", "RefinedWebModel", "RefinedWeb", "mpt", "gpt_bigcode", "starcoder2", "nemotron_h", "gpt_neox", "bloom"}


@dataclass(frozen=True, slots=True)
class WeightEstimate:
    """Parameters and bytes of the whole model, and the parameters one token passes through."""

    params: int
    active_params: int
    bytes: int

    @property
    def flops_per_token(self) -> float:
        """Forward FLOPs per token: two per active parameter (multiply and add)."""
        return 2.0 * self.active_params


def estimate_weights(spec: ModelSpec) -> WeightEstimate:
    raw = spec.raw
    hidden = spec.hidden_size
    bits = DTYPE_BITS[spec.dtype]
    linear_bits, expert_bits = _quant_bits(raw, bits)
    embed = spec.vocab_size * hidden * (1 if spec.tie_embeddings else 2)
    attn = sum(_attention_params(spec, layer, i) for i, layer in enumerate(spec.layers))
    dense, experts, active_experts = _mlp_params(spec)
    params = embed + attn + dense + experts
    active = embed + attn + dense + active_experts
    total_bits = embed * bits + (attn + dense) * linear_bits + experts * expert_bits
    return WeightEstimate(params=int(params), active_params=int(active), bytes=int(total_bits // 8))


def _quant_bits(raw: dict[str, Any], bits: int) -> tuple[float, float]:
    """Bits per weight of linear layers and of experts under the config's quantization."""
    quant = raw.get("quantization_config")
    if not isinstance(quant, dict):
        return bits, bits
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8":
        return 8, 8
    if method == "mxfp4":
        return bits, 4.25
    if isinstance(quant.get("bits"), int):
        return quant["bits"], quant["bits"]
    return bits, bits


def _attention_params(spec: ModelSpec, layer: LayerSpec, index: int) -> int:
    raw, hidden, heads = spec.raw, spec.hidden_size, spec.num_heads
    if layer.kind in ("full", "sliding"):
        hd = layer.head_dim
        return hidden * hd * (2 * heads + 2 * layer.num_kv_heads)
    if layer.kind == "mla":
        nope, rope, v = raw["qk_nope_head_dim"], raw["qk_rope_head_dim"], raw["v_head_dim"]
        q_rank = raw.get("q_lora_rank")
        q = hidden * q_rank + q_rank * heads * (nope + rope) if q_rank else hidden * heads * (nope + rope)
        kv = hidden * (raw["kv_lora_rank"] + rope) + raw["kv_lora_rank"] * heads * (nope + v)
        return q + kv + heads * v * hidden
    if layer.kind == "state":
        return _state_params(spec, layer)
    blocks = raw.get("block_configs")
    if blocks and blocks[index]["attention"].get("replace_with_linear"):
        return hidden * hidden
    return 0


def _state_params(spec: ModelSpec, layer: LayerSpec) -> int:
    raw, hidden = spec.raw, spec.hidden_size
    if "linear_num_value_heads" in raw:  # gated DeltaNet
        key_dim = raw["linear_num_key_heads"] * raw["linear_key_head_dim"]
        value_dim = raw["linear_num_value_heads"] * raw["linear_value_head_dim"]
        return hidden * (2 * key_dim + 2 * value_dim + 2 * raw["linear_num_value_heads"]) + value_dim * hidden
    if "mamba_num_heads" in raw:  # Mamba2
        d_inner = raw["mamba_num_heads"] * raw["mamba_head_dim"]
        groups_state = 2 * raw.get("n_groups", 1) * raw["ssm_state_size"]
        return hidden * (2 * d_inner + groups_state + raw["mamba_num_heads"]) + d_inner * hidden
    d_inner = raw.get("mamba_expand", 2) * hidden  # Mamba1
    d_state = raw.get("mamba_d_state", 16)
    dt_rank = raw.get("mamba_dt_rank") or -(-hidden // 16)
    return hidden * 2 * d_inner + d_inner * (dt_rank + 2 * d_state) + dt_rank * d_inner + d_inner * hidden


def _mlp_params(spec: ModelSpec) -> tuple[int, int, int]:
    """(dense MLP params, all expert params, active expert params) summed over layers."""
    raw, hidden, n = spec.raw, spec.hidden_size, len(spec.layers)
    experts = raw.get("n_routed_experts") or raw.get("num_local_experts") or raw.get("num_experts") or 0
    top_k = raw.get("num_experts_per_tok") or raw.get("experts_per_token") or 1
    dense_size = _dense_intermediate(spec)
    mult = 2 if spec.model_type in NON_GATED else 3
    if "block_configs" in raw:
        return sum(_nas_ffn(hidden, b["ffn"]) for b in raw["block_configs"]), 0, 0
    if spec.model_type == "nemotron_h":
        return raw["hybrid_override_pattern"].count("-") * mult * hidden * dense_size, 0, 0
    if not experts:
        return n * mult * hidden * dense_size, 0, 0
    moe_layers = [i for i in range(n) if _is_moe_layer(raw, i)]
    expert_size = raw.get("moe_intermediate_size") or raw.get("intermediate_size")
    shared = _shared_expert_size(raw, expert_size)
    per_expert = 3 * hidden * expert_size
    per_moe_dense = 3 * hidden * shared + hidden * experts  # shared experts and the router
    dense = (n - len(moe_layers)) * mult * hidden * dense_size + len(moe_layers) * per_moe_dense
    return dense, len(moe_layers) * experts * per_expert, len(moe_layers) * top_k * per_expert


def _dense_intermediate(spec: ModelSpec) -> int:
    raw = spec.raw
    for key in ("intermediate_size_mlp", "ffn_dim", "ffn_hidden_size", "n_inner", "intermediate_size"):
        if raw.get(key):
            return int(raw[key])
    if spec.model_type == "mpt":
        return int(raw.get("expansion_ratio", 4) * spec.hidden_size)
    return 4 * spec.hidden_size


def _is_moe_layer(raw: dict[str, Any], i: int) -> bool:
    if "first_k_dense_replace" in raw:
        return i >= raw["first_k_dense_replace"] and i % raw.get("moe_layer_freq", 1) == 0
    if "interleave_moe_layer_step" in raw:
        return (i + 1) % raw["interleave_moe_layer_step"] == 0
    if "expert_layer_period" in raw:
        return i % raw["expert_layer_period"] == raw.get("expert_layer_offset", 0)
    if i in (raw.get("mlp_only_layers") or []):
        return False
    return (i + 1) % (raw.get("decoder_sparse_step") or 1) == 0


def _shared_expert_size(raw: dict[str, Any], expert_size: int) -> int:
    if raw.get("n_shared_experts"):
        return raw["n_shared_experts"] * expert_size
    if raw.get("shared_expert_intermediate_size"):
        return raw["shared_expert_intermediate_size"]
    if raw.get("model_type") == "llama4_text":
        return raw["intermediate_size"]
    return 0


def _nas_ffn(hidden: int, ffn: dict[str, Any]) -> int:
    """Nemotron-NAS: a gated MLP of ffn_mult x hidden x 2/3, rounded up to a multiple of 256."""
    if ffn.get("no_op"):
        return 0
    if ffn.get("replace_with_linear"):
        return hidden * hidden
    size = int(2 * ffn["ffn_mult"] * hidden / 3)
    size = -(-size // 256) * 256
    return 3 * hidden * size
