"""KV pools as real tensors, one set per layer group, built from the same KVLayout as `kvplan size`.

Shapes follow a serving engine's: per layer, K is (num_blocks, block_size, kv_heads, head_dim) and V
(num_blocks, block_size, kv_heads, v_head_dim); an MLA layer keeps one latent tensor
(num_blocks, block_size, latent_dim); a recurrent-state layer keeps (max_seqs, state_elems). Each
group records three byte counts: kvplan's prediction (from the layout's per-token and per-sequence
bytes only), what its tensors hold (numel x element_size), and on CUDA the change in
torch.cuda.memory_allocated() while they were created.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvplan.backends.torch.codec import Codec, codec_for
from kvplan.model.layout import KVLayout, LayerGroup


def predicted_group_bytes(group: LayerGroup, num_blocks: int, block_size: int, max_seqs: int) -> int:
    """kvplan's bytes for a group's pool: blocks x slots x per-token bytes, or state x sequences."""
    if group.kind == "state":
        return group.state_bytes * max_seqs
    return group.bytes_per_token * num_blocks * block_size


def predicted_pool_bytes(layout: KVLayout, num_blocks: int, block_size: int, max_seqs: int) -> int:
    """The whole pool in kvplan's terms: num_blocks x block_size x bytes/token + state x max_seqs."""
    return num_blocks * block_size * layout.bytes_per_token + layout.state_bytes * max_seqs


def value_shapes(group: LayerGroup, num_blocks: int, block_size: int, max_seqs: int) -> dict[str, tuple]:
    """Logical (unpacked) shape of each tensor one layer of `group` keeps, by role."""
    if group.kind == "state":
        return {"state": (max_seqs, group.state_elems)}
    if group.kind == "mla":
        return {"latent": (num_blocks, block_size, group.latent_dim)}
    heads = group.num_kv_heads
    return {"k": (num_blocks, block_size, heads, group.head_dim),
            "v": (num_blocks, block_size, heads, group.v_head_dim)}


@dataclass
class GroupPool:
    """The tensors of one layer group: `tensors[role][layer]`, in `codec`'s storage dtype."""

    index: int
    group: LayerGroup
    codec: Codec
    tensors: dict[str, list[torch.Tensor]]
    predicted_bytes: int
    measured_bytes: int | None = None  # CUDA memory_allocated delta; None off CUDA
    shapes: dict[str, tuple] = field(default_factory=dict)  # storage shape per role

    @property
    def allocated_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for ts in self.tensors.values() for t in ts)

    @property
    def num_tensors(self) -> int:
        return sum(len(ts) for ts in self.tensors.values())

    @property
    def per_token(self) -> bool:
        return self.group.kind != "state"

    def _flat(self, role: str, layer: int) -> torch.Tensor:
        """Raw view with blocks and slots merged into one token-slot dimension."""
        return self.codec.raw(self.tensors[role][layer]).flatten(0, 1)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None) -> None:
        """Store token values at flat slots (block * block_size + offset); MLA passes v=None."""
        if self.group.kind == "mla":
            self._flat("latent", layer)[slots] = self.codec.raw(self.codec.encode(k))
            return
        self._flat("k", layer)[slots] = self.codec.raw(self.codec.encode(k))
        self._flat("v", layer)[slots] = self.codec.raw(self.codec.encode(v))

    def copy_block(self, src: int, dst: int) -> None:
        """Copy-on-write as the allocator asked: block src -> dst in every layer's tensors."""
        for ts in self.tensors.values():
            for t in ts:
                raw = self.codec.raw(t)
                raw[dst].copy_(raw[src])

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's (K, V) pool tensors in storage form; MLA gives the latent as both."""
        if self.group.kind == "mla":
            latent = self.tensors["latent"][layer]
            return latent, latent
        return self.tensors["k"][layer], self.tensors["v"][layer]


def _cuda_allocated(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device)


def allocate_pools(
    layout: KVLayout, *, num_blocks: int, block_size: int, max_seqs: int,
    device: str | torch.device = "cpu", state_dtype: str | None = None,
) -> list[GroupPool]:
    """One GroupPool per layout group, zero-filled, each measured on CUDA as it is created.

    `state_dtype` (a kvplan dtype name) is the recurrent state's dtype; by default the one whose
    size matches the layout's state bits.
    """
    device = torch.device(device)
    kv_codec = codec_for(layout.kv_dtype, device)
    pools = []
    for i, group in enumerate(layout.groups):
        codec = codec_for(state_dtype or _by_bits(group.state_dtype_bits), device) if group.kind == "state" \
            else kv_codec
        before = _cuda_allocated(device)
        tensors, shapes = {}, {}
        for role, shape in value_shapes(group, num_blocks, block_size, max_seqs).items():
            shapes[role] = codec.storage_shape(shape)
            tensors[role] = [_zeros(shapes[role], codec, device) for _ in range(group.num_layers)]
        after = _cuda_allocated(device)
        measured = None if before is None else after - before
        predicted = predicted_group_bytes(group, num_blocks, block_size, max_seqs)
        pools.append(GroupPool(i, group, codec, tensors, predicted, measured, shapes))
    return pools


def _zeros(shape: tuple, codec: Codec, device: torch.device) -> torch.Tensor:
    t = torch.empty(shape, dtype=codec.storage, device=device)
    codec.raw(t).zero_()  # through the raw view: fill is not implemented for fp8 everywhere
    return t


def _by_bits(bits: int) -> str:
    return {32: "fp32", 16: "bf16", 8: "fp8"}.get(bits, "bf16")
