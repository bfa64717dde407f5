"""The CPU tier of vLLM's native KV offloading, as its scheduler side keeps it: an LRU of blocks.

After vllm/v1/kv_offload/cpu/manager.py (CPUOffloadingManager) with the LRU policy
(vllm/v1/kv_offload/cpu/policies/lru.py, LRUCachePolicy): a fixed number of CPU blocks, each
holding one GPU block's KV under its block hash (here: any hashable key; the serve engines pass
block nodes, kvplan/sim/prefix_ids.py), in least-recently-used order. The step-by-step serve
reference (kvplan/sim/reference.py) runs on it; the fast kernel keeps the same list in flat
arrays (kvplan/sim/kernel.py, `cpu_*`). When its rules are used is kvplan/sim/offload.py's.

- `lookup(keys)`: how many of `keys`, from the first, the tier holds (stopping at the first
  miss), and whether one of those is being loaded (pinned).
- `touch(keys)`: the ones held move to the most recent end, the first key last (LRUCachePolicy
  walks them in reverse), so a prefix's head is evicted after its tail.
- `store(keys)` (prepare_store): keys held already are skipped; the others need free blocks, and
  when there are too few, least recently used blocks are evicted, skipping pinned ones and the
  batch's own; if too few can be evicted, nothing is stored. New keys join the most recent end in
  order. Returns how many were stored.
- `pin` / `unpin` (prepare_load / complete_load): a block being loaded has a ref count and cannot
  be evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Hashable, Sequence


class CpuTier:
    """A CPU tier of `num_blocks` blocks: key -> ref count (loads in flight), oldest first."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"a CPU tier needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks: OrderedDict[Hashable, int] = OrderedDict()
        self.num_pinned = 0
        self.blocks_stored = self.blocks_evicted = 0

    def lookup(self, keys: Sequence[Hashable]) -> tuple[int, bool]:
        """(leading keys held, whether one of them is being loaded); changes nothing."""
        hits, pinned = 0, False
        for key in keys:
            ref = self.blocks.get(key)
            if ref is None:
                break
            hits += 1
            pinned |= ref > 0
        return hits, pinned

    def touch(self, keys: Sequence[Hashable]) -> None:
        for key in reversed(keys):
            if key in self.blocks:
                self.blocks.move_to_end(key)

    def store(self, keys: Sequence[Hashable]) -> int:
        """Store the batch `keys` (all or none of the new ones); returns how many were new."""
        batch = set(keys)
        new = [k for k in keys if k not in self.blocks]
        if not new:
            return 0
        evict = len(new) - (self.num_blocks - len(self.blocks))
        if evict > 0:
            victims = [k for k, ref in self.blocks.items() if ref == 0 and k not in batch][:evict]
            if len(victims) < evict:
                return 0
            for key in victims:
                del self.blocks[key]
            self.blocks_evicted += evict
        for key in new:
            self.blocks[key] = 0
        self.blocks_stored += len(new)
        return len(new)

    def pin(self, keys: Sequence[Hashable]) -> None:
        for key in keys:
            self.blocks[key] += 1
            self.num_pinned += self.blocks[key] == 1

    def unpin(self, keys: Sequence[Hashable]) -> None:
        for key in keys:
            if self.blocks[key] <= 0:
                raise AssertionError(f"block {key!r} is not being loaded")
            self.blocks[key] -= 1
            self.num_pinned -= self.blocks[key] == 0
