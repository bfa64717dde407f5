"""A paged KV cache on real tensors: kvplan's own BlockManager decides, torch pools hold the data.

Every per-token group (full, sliding, MLA) shares one block table per request, as vLLM v0 did: a
sliding-window group keeps all of a request's tokens and the window is applied when reading.
Recurrent-state groups keep one slot per live sequence. Writes go where the allocator says, and a
copy-on-write block copy it reports is made in every per-token pool before the token is written.
"""

from __future__ import annotations

from typing import Hashable, Sequence

import torch

from kvplan.backends.torch.pool import GroupPool, allocate_pools
from kvplan.memory.paged import BlockManager, TokenWrite
from kvplan.model.layout import KVLayout

KV = tuple[torch.Tensor, "torch.Tensor | None"]  # (K (n, H, D), V (n, H, Dv)) or (latent (n, Dl), None)


class PagedKVCache:
    """Block tables from kvplan.memory.paged over torch pools; `kv_layers` orders the K/V inputs.

    Every method that writes tokens takes one KV pair per entry of `kv_layers` (group pool, layer).
    """

    def __init__(self, layout: KVLayout, *, num_blocks: int, block_size: int, max_seqs: int,
                 device: str | torch.device = "cpu", state_dtype: str | None = None) -> None:
        self.layout = layout
        self.device = torch.device(device)
        self.block_size = block_size
        self.max_seqs = max_seqs
        self.manager = BlockManager(num_blocks, block_size)
        self.pools = allocate_pools(layout, num_blocks=num_blocks, block_size=block_size,
                                    max_seqs=max_seqs, device=self.device, state_dtype=state_dtype)
        self.kv_layers = [(p, i) for p in self.pools if p.per_token for i in range(p.group.num_layers)]
        self.state_layers = [(p, i) for p in self.pools if not p.per_token for i in range(p.group.num_layers)]
        self.state_slots: dict[Hashable, int] = {}
        self._free_state_slots = list(range(max_seqs))
        self.copies: list[tuple[int, int]] = []  # copy-on-write copies made, in order

    # -- writing -------------------------------------------------------------------------------

    def add_request(self, rid: Hashable, kv: Sequence[KV], states: Sequence[torch.Tensor] = ()) -> None:
        """Start `rid` with its prompt's K/V (n tokens, n may be 0) and its initial recurrent state."""
        n = self._num_tokens(kv)
        if self.state_layers and not self._free_state_slots:
            raise ValueError(f"no free state slot for {rid!r}; max_seqs is {self.max_seqs}")
        self.manager.add_request(rid, n)
        if self.state_layers:
            self.state_slots[rid] = self._free_state_slots.pop(0)
            for (pool, layer), state in zip(self.state_layers, states, strict=False):
                self._state_tensor(pool, layer)[self.state_slots[rid]] = pool.codec.raw(pool.codec.encode(state))
        self._write(self.slots(rid), kv)

    def append(self, rid: Hashable, kv: Sequence[KV]) -> TokenWrite:
        """One decode token: the allocator places it (copying a shared block first if it says so)."""
        where = self.manager.append(rid)
        if where.copy is not None:
            self._copy_block(*where.copy)
        slot = torch.tensor([where.block * self.block_size + where.offset], device=self.device)
        self._write(slot, kv)
        return where

    def append_tokens(self, rid: Hashable, kv: Sequence[KV]) -> tuple[int, int] | None:
        """A chunk of tokens at once (chunked prefill); returns the copy-on-write copy made, if any."""
        n = self._num_tokens(kv)
        start = self.manager.lengths[rid]
        copy = self.manager.append_tokens(rid, n)
        if copy is not None:
            self._copy_block(*copy)
        self._write(self.slots(rid)[start:start + n], kv)
        return copy

    def fork(self, parent: Hashable, child: Hashable) -> None:
        """`child` shares all of `parent`'s blocks; its recurrent state starts as a copy."""
        if self.state_layers and not self._free_state_slots:
            raise ValueError(f"no free state slot for {child!r}; max_seqs is {self.max_seqs}")
        self.manager.fork(parent, child)
        if self.state_layers:
            self.state_slots[child] = slot = self._free_state_slots.pop(0)
            for pool, layer in self.state_layers:
                t = self._state_tensor(pool, layer)
                t[slot].copy_(t[self.state_slots[parent]])

    def free(self, rid: Hashable) -> None:
        self.manager.free(rid)
        if rid in self.state_slots:
            self._free_state_slots.append(self.state_slots.pop(rid))

    # -- reading -------------------------------------------------------------------------------

    def slots(self, rid: Hashable) -> torch.Tensor:
        """Flat slot (block * B + offset) of every position of `rid`, from its block table."""
        pos = torch.arange(self.manager.lengths[rid], device=self.device)
        table = torch.tensor(self.manager.tables[rid], dtype=torch.long, device=self.device)
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def block_tables(self, rids: Sequence[Hashable]) -> tuple[torch.Tensor, torch.Tensor]:
        """(block tables padded with 0 to the longest, sequence lengths) as int64 tensors."""
        tables = [self.manager.tables[r] for r in rids]
        width = max(1, max(len(t) for t in tables))
        padded = torch.zeros((len(rids), width), dtype=torch.long)
        for i, t in enumerate(tables):
            padded[i, :len(t)] = torch.tensor(t, dtype=torch.long)
        lens = torch.tensor([self.manager.lengths[r] for r in rids], dtype=torch.long)
        return padded.to(self.device), lens.to(self.device)

    def read_state(self, rid: Hashable, index: int) -> torch.Tensor:
        """Recurrent state of state layer `index` (order of `state_layers`) for `rid`, decoded."""
        pool, layer = self.state_layers[index]
        raw = self._state_tensor(pool, layer)[self.state_slots[rid]]
        return pool.codec.decode(pool.codec.unraw(raw), torch.float32)

    # -- internals -----------------------------------------------------------------------------

    def _num_tokens(self, kv: Sequence[KV]) -> int:
        if len(kv) != len(self.kv_layers):
            raise ValueError(f"expected K/V for {len(self.kv_layers)} layers, got {len(kv)}")
        return int(kv[0][0].shape[0]) if kv else 0

    def _write(self, slots: torch.Tensor, kv: Sequence[KV]) -> None:
        if slots.numel() == 0:
            return
        for (pool, layer), (k, v) in zip(self.kv_layers, kv, strict=True):
            pool.write(layer, slots, k, v)

    def _copy_block(self, src: int, dst: int) -> None:
        for pool in self.pools:
            if pool.per_token:
                pool.copy_block(src, dst)
        self.copies.append((src, dst))

    @staticmethod
    def _state_tensor(pool: GroupPool, layer: int) -> torch.Tensor:
        return pool.codec.raw(pool.tensors["state"][layer])
