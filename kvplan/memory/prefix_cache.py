"""Automatic prefix caching on the paged allocator, as in vLLM v1's block pool (kv_cache_manager.py).

Unrelated requests that start with the same text (a system prompt, an earlier turn of the same
conversation) can reuse the blocks already computed for it. Only full blocks are cached: a
partly filled block can still be written, and its content is not final.

A cached block is named by a key `(parent node, identity)`. `identity` says what the block's
tokens are (a tuple of token ids, a trace's hash id, anything hashable and comparable); `parent
node` names the cached block before it, so a key covers the whole prefix, like vLLM's chained
block hash. The parent is named by a node number that the cache hands out afresh every time it
caches a block and never reuses, so a key can only match a block whose whole prefix is the
request's own: a dict lookup compares the keys themselves, never only their hashes, and a hash
collision (same hash, different tokens) cannot share a block. Node 0 (`ROOT`) is the parent of
a prompt's first block.

A lookup walks the prompt's blocks from the first and stops at the first miss: every hit is
shared (ref count + 1). When its last owner frees a cached block it stays cached with ref count
0 in the free list, which doubles as the eviction order (least recently freed first), and a
request's blocks go back tail first so its shared head outlives its private tail. A hit on a free
cached block pulls it out of the middle of the free list in O(1); taking a block from the front
for new data evicts whatever it cached (its key is dropped before the block is handed out).

With `enable_caching=False` every call behaves exactly as the plain BlockManager (tested on random
op sequences: same tables, same ref counts, same free-list order).

vLLM's rules kept here: when the whole prompt is cached, the last block is not taken from the
cache, since at least one prompt token must be computed to produce the first output token
(vLLM: max_cache_hit_length = num_tokens - 1); a block whose key is already cached (that last
block, recomputed) is not cached a second time. Metrics use vLLM's definitions: queries are the
prompt tokens looked up, hits the tokens served from the cache, hit rate = hits / queries.
Tokens that are appended later (`append`, `append_tokens`: decoded output) have no identity and
are never cached.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Hashable, Sequence

from kvplan.memory.paged import BlockManager, FreeBlockQueue, OutOfBlocks

ROOT = 0  # the parent node of a prompt's first block; cached blocks get nodes 1, 2, ...


class LruFreeQueue(FreeBlockQueue):
    """The free list with two bulk operations for the hot paths; order semantics unchanged.

    `popleft_n(n)` equals n calls of `popleft`, and `extend(blocks)` equals `append` of each in
    turn, without a Python call per block.
    """

    def popleft_n(self, n: int) -> list[int]:
        if n > self._len:
            raise IndexError(f"pop {n} from a free list of {self._len}")
        nxt, prev, out = self._next, self._prev, []
        block = nxt[self._head]
        for _ in range(n):
            out.append(block)
            following = nxt[block]
            nxt[block] = prev[block] = -1
            block = following
        nxt[self._head], prev[block] = block, self._head
        self._len -= n
        return out

    def extend(self, blocks: Sequence[int]) -> None:
        nxt, prev, last = self._next, self._prev, self._prev[self._tail]
        for block in blocks:
            if prev[block] != -1:
                raise ValueError(f"block {block} is already in the free list")
            nxt[last], prev[block] = block, last
            last = block
        nxt[last], prev[self._tail] = self._tail, last
        self._len += len(blocks)


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    """Prefix-cache counters with vLLM's definitions.

    requests: requests looked up. queries: their prompt tokens. hits: prompt tokens served from
    the cache (= prefill tokens saved). blocks_reused: cache hits on a block no request was
    using (pulled back out of the free list). blocks_evicted: cached blocks whose key was
    dropped because the block was taken for new data.
    """

    requests: int = 0
    queries: int = 0
    hits: int = 0
    blocks_reused: int = 0
    blocks_evicted: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    @property
    def prefill_tokens_saved(self) -> int:
        return self.hits

    def to_dict(self) -> dict:
        return {**asdict(self), "hit_rate": self.hit_rate,
                "prefill_tokens_saved": self.prefill_tokens_saved}  # fmt: skip


class PrefixCachingBlockManager(BlockManager):
    """A BlockManager whose full prompt blocks outlive their request as a shared LRU cache.

    `add_request(rid, num_tokens, block_ids)` takes one identity per full block of the prompt
    (fewer is fine: the rest of the prompt is unique to the request, as is a prompt without
    ids). Everything else (append, append_tokens, fork, slot_of, the can_* checks) is the
    BlockManager's; the free list is an `LruFreeQueue`.
    """

    def __init__(self, num_blocks: int, block_size: int, *, enable_caching: bool = True) -> None:
        super().__init__(num_blocks, block_size)
        self.free_list = LruFreeQueue(num_blocks)
        self.enable_caching = enable_caching
        self.cached_blocks: dict[tuple[int, Hashable], int] = {}  # key -> block
        self.block_key: list[tuple[int, Hashable] | None] = [None] * num_blocks
        self.block_node: list[int] = [ROOT] * num_blocks  # node of a cached block
        self._next_node = ROOT + 1
        self._requests = self._queries = self._hits = self._reused = self._evicted = 0

    # -- queries -------------------------------------------------------------------------------

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that hold a cached prefix block, in use or not."""
        return len(self.cached_blocks)

    def is_cached(self, block: int) -> bool:
        return self.block_key[block] is not None

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(self._requests, self._queries, self._hits, self._reused,
                                self._evicted)  # fmt: skip

    def match_prefix(self, block_ids: Sequence[Hashable] | None, num_tokens: int) -> list[int]:
        """The cached blocks a prompt of `num_tokens` tokens would reuse, in order; changes nothing."""
        if not self.enable_caching or not block_ids:
            return []
        cached, node_of, node, hits = self.cached_blocks, self.block_node, ROOT, []
        for identity in block_ids[: max(0, (num_tokens - 1) // self.block_size)]:
            block = cached.get((node, identity))
            if block is None:
                break
            hits.append(block)
            node = node_of[block]
        return hits

    def _blocks_short(self, hits: list[int], num_tokens: int) -> int:
        """How many more blocks a prompt needs than the free list can give, after its hits."""
        ref = self.ref_count
        revived = sum(1 for b in hits if ref[b] == 0)  # leaves the free list
        return self.blocks_for(num_tokens) - len(hits) - (len(self.free_list) - revived)

    def can_add_request(self, num_tokens: int = 0, block_ids: Sequence[Hashable] | None = None) -> bool:
        return self._blocks_short(self.match_prefix(block_ids, num_tokens), num_tokens) <= 0

    # -- changes -------------------------------------------------------------------------------

    def _take_block(self) -> int:
        block = super()._take_block()
        if self.block_key[block] is not None:
            self._evict(block)
        return block

    def _evict(self, block: int) -> None:
        del self.cached_blocks[self.block_key[block]]
        self.block_key[block] = None
        self._evicted += 1

    def add_request(self, rid: Hashable, num_tokens: int = 0,
                    block_ids: Sequence[Hashable] | None = None) -> int:  # fmt: skip
        """Start `rid` with a prompt of `num_tokens` tokens; returns how many came from the cache.

        Reuses the longest cached prefix of `block_ids`, takes new blocks for the rest (evicting
        the least recently freed cached blocks), and caches the prompt's new full blocks. All of
        it or nothing: raises OutOfBlocks before changing anything.
        """
        if not self.enable_caching:
            super().add_request(rid, num_tokens)
            return 0
        if rid in self.tables:
            raise ValueError(f"request {rid!r} already exists")
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        hits = self.match_prefix(block_ids, num_tokens)
        if self._blocks_short(hits, num_tokens) > 0:
            raise OutOfBlocks(rid)
        ref, shared = self.ref_count, 0
        for block in hits:
            if ref[block]:
                shared += 1
            else:
                self.free_list.remove(block)
                self._reused += 1
            ref[block] += 1
        table = hits + self._take_blocks(self.blocks_for(num_tokens) - len(hits))
        self.tables[rid], self.lengths[rid] = table, num_tokens
        self._stored += num_tokens - shared * self.block_size
        if block_ids:
            full = min(len(block_ids), num_tokens // self.block_size)
            self._cache_blocks(table, block_ids, len(hits), full)
        cached_tokens = len(hits) * self.block_size
        self._requests += 1
        self._queries += num_tokens
        self._hits += cached_tokens
        return cached_tokens

    def _take_blocks(self, n: int) -> list[int]:
        """n blocks from the front of the free list, their cache entries evicted."""
        blocks = self.free_list.popleft_n(n)
        ref, key_of = self.ref_count, self.block_key
        for block in blocks:
            if ref[block]:
                raise AssertionError(f"free block {block} still has {ref[block]} owners")
            ref[block] = 1
            if key_of[block] is not None:
                self._evict(block)
        return blocks

    def _cache_blocks(self, table: list[int], block_ids, start: int, stop: int) -> None:
        """Enter table[start:stop] in the cache, chained after table[start - 1]."""
        cached, key_of, node_of = self.cached_blocks, self.block_key, self.block_node
        node = node_of[table[start - 1]] if start else ROOT
        next_node = self._next_node
        for j in range(start, stop):
            identity = block_ids[j]
            if identity is None:
                break  # a block with unique tokens: nothing after it can match another prompt
            key = (node, identity)
            if key in cached:
                break  # the same prefix is already cached (a recomputed last block)
            block = table[j]
            cached[key], key_of[block], node_of[block] = block, key, next_node
            node, next_node = next_node, next_node + 1
        self._next_node = next_node

    def free(self, rid: Hashable) -> None:
        """Finish `rid`; blocks no other table names join the back of the free list, tail first.

        Cached blocks keep their key there until evicted. With caching off this is the
        BlockManager's free (head first).
        """
        if not self.enable_caching:
            super().free(rid)
            return
        table, length = self.tables.pop(rid), self.lengths.pop(rid)
        ref, freed = self.ref_count, []
        for block in reversed(table):
            ref[block] -= 1
            if not ref[block]:
                freed.append(block)
        if freed:
            size = self.block_size
            tail = length - (len(table) - 1) * size  # tokens in the last block
            stored_tail = tail if ref[table[-1]] == 0 else 0
            self._stored -= (len(freed) - (stored_tail > 0)) * size + stored_tail
            self.free_list.extend(freed)

    # -- checking ------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """The BlockManager's invariants, plus the cache's.

        Every block is exactly one of free-uncached, free-cached (in LRU) or in use; the key map
        and the per-block keys agree both ways; a cached block in use is full in every table that
        names it; cached nodes are distinct; with caching off nothing is cached.
        """
        super().check_invariants()
        for key, block in self.cached_blocks.items():
            if self.block_key[block] != key:
                raise AssertionError(f"key {key!r} maps to block {block}, which holds "
                                     f"{self.block_key[block]!r}")  # fmt: skip
        keyed = [b for b in range(self.num_blocks) if self.block_key[b] is not None]
        if len(keyed) != len(self.cached_blocks):
            raise AssertionError(f"{len(keyed)} blocks carry a key, {len(self.cached_blocks)} keys")
        if not self.enable_caching and keyed:
            raise AssertionError("caching is off but blocks are cached")
        nodes = [self.block_node[b] for b in keyed]
        if len(set(nodes)) != len(nodes) or ROOT in nodes:
            raise AssertionError(f"cached nodes are not distinct: {nodes}")
        free = set(self.free_list)
        in_use = {b for b in range(self.num_blocks) if self.ref_count[b] > 0}
        free_cached = free.intersection(keyed)
        if len(free - free_cached) + len(free_cached) + len(in_use) != self.num_blocks:
            raise AssertionError("blocks are not partitioned into free, free-cached and in use")
        for rid, table in self.tables.items():
            filled = self.lengths[rid] - (len(table) - 1) * self.block_size
            if table and self.block_key[table[-1]] is not None and filled != self.block_size:
                raise AssertionError(f"{rid!r}: cached block {table[-1]} is not full")
