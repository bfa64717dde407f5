"""What kvplan knows of a model once its config is read: ModelSpec, and a LayerSpec per decoder layer.

LayerSpec says what one layer keeps for a sequence: per-token K/V ("full"), a window of it
("sliding"), a latent (MLA), a constant recurrent state (Mamba, gated DeltaNet, lightning
attention) or nothing. The reader that fills these in is kvplan/model/config.py (the generic
attention fields) with the family rules of kvplan/model/families/. This module imports nothing of
kvplan's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class LayerSpec:
    """What one layer keeps for a sequence (kind "none" keeps nothing). Head counts are totals."""

    kind: str
    num_kv_heads: int = 0
    head_dim: int = 0
    v_head_dim: int = 0
    latent_dim: int = 0
    window: int | None = None
    state_elems: int = 0
    state_heads: int = 0  # heads the state splits into under tensor parallelism
    # A second token mixer that runs beside this one in the same decoder layer and keeps its own
    # cache (Falcon-H1: attention and a Mamba2 mixer side by side in every layer). None for the
    # usual one mixer per layer.
    parallel: LayerSpec | None = None

    @property
    def mixers(self) -> tuple[LayerSpec, ...]:
        """The token mixers of this decoder layer, each keeping its own cache: this one, then the
        one in parallel with it. A layout has a group per mixer kind (vLLM gives each mixer of a
        parallel hybrid its own KV cache spec, so a 44-layer Falcon-H1 has 44 attention and 44
        Mamba cache layers)."""
        if self.parallel is None:
            return (self,)
        return (replace(self, parallel=None), *self.parallel.mixers)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The facts of a model that kvplan uses, read from its config."""

    name: str
    source: str
    model_type: str
    dtype: str
    dtype_note: str
    max_context: int | None  # None: the config states none (BLOOM's ALiBi)
    hidden_size: int
    num_heads: int
    vocab_size: int
    tie_embeddings: bool
    layers: tuple[LayerSpec, ...]
    raw: dict[str, Any] = field(repr=False, compare=False, hash=False)
