"""Build the per-GPU KVLayout of a model for a KV dtype and a tensor-parallel degree."""

from __future__ import annotations

from kvplan.errors import UsageError
from kvplan.model.dtypes import DTYPE_BITS, dtype_bits, kv_dtype_name
from kvplan.model.layout import KVLayout, LayerGroup
from kvplan.model.spec import LayerSpec, ModelSpec

MAX_TP = 65_536


def kv_heads_per_gpu(num_kv_heads: int, tp: int) -> int:
    """KV heads one rank holds: split evenly, or replicated (one per rank) when tp exceeds them.

    vLLM requires one to divide the other, and so do we.
    """
    if num_kv_heads >= tp:
        if num_kv_heads % tp:
            raise UsageError(f"{num_kv_heads} KV heads cannot be split evenly over {tp} GPUs", field="tp")
        return num_kv_heads // tp
    if tp % num_kv_heads:
        raise UsageError(f"{tp} GPUs cannot replicate {num_kv_heads} KV heads evenly", field="tp")
    return 1


def build_layout(spec: ModelSpec, kv_dtype: str = "auto", tp: int = 1) -> KVLayout:
    """Group the model's layers by what they keep, sized for one of `tp` GPUs."""
    if not 1 <= tp <= MAX_TP:
        raise UsageError(f"expected an integer from 1 to {MAX_TP:,}, got {tp}", field="tp")
    name = spec.dtype if kv_dtype == "auto" else kv_dtype_name(kv_dtype)
    bits = dtype_bits(name)
    state_bits = DTYPE_BITS[spec.dtype]
    counts: dict[LayerSpec, int] = {}
    for layer in spec.layers:
        for mixer in layer.mixers:  # a parallel hybrid layer (Falcon-H1) adds to two groups
            if mixer.kind != "none":
                counts[mixer] = counts.get(mixer, 0) + 1
    groups = tuple(_group(layer, n, tp, bits, state_bits) for layer, n in counts.items())
    return KVLayout(model=spec.name, kv_dtype=name, tp=tp, groups=groups, max_context=spec.max_context)


def _group(layer: LayerSpec, n: int, tp: int, bits: int, state_bits: int) -> LayerGroup:
    if layer.kind == "mla":  # the latent is shared by all heads, so every rank keeps all of it
        return LayerGroup("mla", n, latent_dim=layer.latent_dim, dtype_bits=bits)
    if layer.kind == "state":
        if layer.state_heads % tp:
            raise UsageError(f"{layer.state_heads} recurrent-state heads cannot be split evenly over {tp} GPUs",
                             field="tp")
        shards = tp
        return LayerGroup(
            "state", n, state_elems=layer.state_elems // shards, dtype_bits=bits, state_dtype_bits=state_bits
        )
    return LayerGroup(
        layer.kind,
        n,
        num_kv_heads=kv_heads_per_gpu(layer.num_kv_heads, tp),
        head_dim=layer.head_dim,
        v_head_dim=layer.v_head_dim,
        window=layer.window,
        dtype_bits=bits,
    )
