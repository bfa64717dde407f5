"""The KV layout of a model: groups of layers, each with what it keeps per token or per sequence.

A layout is computed for one GPU: with tensor parallelism the KV heads are split across ranks
(replicated when there are fewer heads than ranks, as vLLM does) and an MLA latent is replicated.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("full", "sliding", "mla", "state")


@dataclass(frozen=True, slots=True)
class LayerGroup:
    """Layers that keep the same thing for a sequence.

    kind: "full" (K and V for every token), "sliding" (K and V for at most `window` tokens),
    "mla" (one latent vector per token, DeepSeek style), or "state" (a constant recurrent state
    per sequence: Mamba, gated DeltaNet). Layers that keep nothing are left out of the layout.
    Head counts are per GPU.
    """

    kind: str
    num_layers: int
    num_kv_heads: int = 0
    head_dim: int = 0
    v_head_dim: int = 0
    latent_dim: int = 0
    window: int | None = None
    state_elems: int = 0  # elements of recurrent state per layer per sequence (kind "state")
    dtype_bits: int = 16
    state_dtype_bits: int = 16

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown layer kind {self.kind!r}")
        if self.num_layers < 0:
            raise ValueError("num_layers must be >= 0")
        if self.kind == "sliding" and (self.window is None or self.window <= 0):
            raise ValueError("a sliding group needs a positive window")

    @property
    def elems_per_token_per_layer(self) -> int:
        if self.kind in ("full", "sliding"):
            return self.num_kv_heads * (self.head_dim + self.v_head_dim)
        if self.kind == "mla":
            return self.latent_dim
        return 0

    @property
    def bytes_per_token_per_layer(self) -> int:
        return self.elems_per_token_per_layer * self.dtype_bits // 8

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one more token adds across this group's layers (below any window)."""
        return self.bytes_per_token_per_layer * self.num_layers

    @property
    def state_bytes(self) -> int:
        """Constant bytes per sequence across this group's layers (recurrent state)."""
        return self.state_elems * self.state_dtype_bits // 8 * self.num_layers

    def tokens_held(self, tokens: int) -> int:
        """How many tokens' K/V this group keeps for a sequence of `tokens` tokens."""
        if self.kind == "state":
            return 0
        if self.kind == "sliding":
            return min(tokens, self.window)
        return tokens

    def seq_bytes(self, tokens: int) -> int:
        return self.bytes_per_token * self.tokens_held(tokens) + self.state_bytes


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Everything kvplan needs to know about what a model keeps per token and per sequence."""

    model: str
    kv_dtype: str
    tp: int
    groups: tuple[LayerGroup, ...]
    max_context: int | None

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one token adds on one GPU, over every layer that keeps per-token KV."""
        return sum(g.bytes_per_token for g in self.groups)

    @property
    def state_bytes(self) -> int:
        """Constant per-sequence bytes (recurrent state) on one GPU."""
        return sum(g.state_bytes for g in self.groups)

    def kv_bytes(self, tokens: int) -> int:
        """KV bytes of one sequence of `tokens` tokens on one GPU, honouring windows and state."""
        return sum(g.seq_bytes(tokens) for g in self.groups)

    def seq_bytes_in_blocks(self, tokens: int, block_size: int) -> int:
        """Bytes one sequence holds in a paged pool: each per-token group rounds up to whole blocks."""
        total = 0
        for g in self.groups:
            held = g.tokens_held(tokens)
            total += -(-held // block_size) * block_size * g.bytes_per_token + g.state_bytes
        return total

    @property
    def num_layers(self) -> int:
        return sum(g.num_layers for g in self.groups)
