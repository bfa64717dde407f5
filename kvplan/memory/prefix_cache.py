"""Automatic prefix caching on the paged allocator, after vLLM v1's block pool.

Unrelated requests that start with the same text (a system prompt, an earlier turn of the same
conversation) reuse the blocks already computed for it. Only full blocks are cached: a partly
filled block can still be written, so its content is not final.

A cached block is named by a chained key (parent node, identity). The identity says what the
block's tokens are (a tuple of token ids, a trace's hash id: anything hashable); the parent node
names the cached block before it, so the key covers the whole prefix, like vLLM's chained block
hash. Every block entering the cache gets a fresh node number, never reused, so a key can only
match a block whose whole prefix is the request's own. Keys are compared, never only hashed:
a hash collision (same hash, different tokens) cannot share a block. Node 0 (ROOT) is the parent
of a prompt's first block.

A lookup walks the prompt's blocks from the first and stops at the first miss; each hit gains an
owner (ref count + 1). When its last owner frees a cached block it stays cached with ref count 0
in the free list, which doubles as the eviction order (least recently freed first); a request's
blocks go back tail first, so a shared head outlives the private tails behind it. A hit on a free
cached block pulls it out of the middle of the free list in O(1); a block taken from the front
for new data is evicted first (its key dropped). vLLM's rule: when the whole prompt is cached,
its last block is not reused, because one prompt token must be computed to produce the first
output (max_cache_hit_length = num_tokens - 1); that block, recomputed, is not cached twice.
Tokens appended later (`append`, `append_tokens`: the output) have no identity, never cached.

Runs (`blocks_per_id` = k > 1): one identity names k consecutive blocks, as when a trace's hash
block of H tokens covers H / B simulated blocks; block j of the prompt is (ids[j // k], j % k).
Within a run the next block is implied by the previous one, so only a run's first block goes in
the key map; the others are found from their predecessor (`run_next`, checked against the
predecessor's node). Same results as k = 1 with identities (id, j % k) (tested), with a k-th of
the dict work.

With `enable_caching=False` every call behaves exactly as the plain BlockManager (tested on
random op sequences: same tables, same ref counts, same free-list order). Metrics use vLLM's
definitions: queries are prompt tokens looked up, hits the tokens served from the cache.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from itertools import repeat
from typing import Hashable, Sequence

import numpy as np

from kvplan.memory.free_queue import ArrayFreeQueue
from kvplan.memory.paged import BlockManager, OutOfBlocks

ROOT = 0  # the parent node of a prompt's first block; cached blocks get nodes 1, 2, ...
NO_BLOCK = -1
VECTOR_RUN = 8  # runs at least this long are matched with array operations, shorter ones by steps


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    """Prefix-cache counters with vLLM's definitions.

    requests: requests looked up. queries: their prompt tokens. hits: prompt tokens served from
    the cache (= prefill tokens saved). blocks_reused: hits on a block no request was using
    (pulled back out of the free list). blocks_evicted: cached blocks dropped from the cache
    because they were taken for new data.
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

    `add_request(rid, num_tokens, block_ids)` takes the prompt's identities, one per run of
    `blocks_per_id` full blocks (fewer is fine: the rest of the prompt is unique to the request,
    as is a prompt without ids; a None ends the ids). Everything else (append, append_tokens,
    fork, slot_of, can_append) is the BlockManager's. Per-block state is in numpy arrays indexed
    by block id, so a request's blocks are taken, cached and freed in a few array operations:
    `ref_count`; `block_node` (its node while cached, else ROOT); `parent_node`; `run_next` (the
    block cached after it in its run); `run_head`. `cached_blocks` maps a run head's key to the
    block and `head_key` the block back to its key.
    """

    def __init__(self, num_blocks: int, block_size: int, *, enable_caching: bool = True,
                 blocks_per_id: int = 1) -> None:  # fmt: skip
        super().__init__(num_blocks, block_size)
        if blocks_per_id < 1:
            raise ValueError(f"blocks_per_id must be >= 1, got {blocks_per_id}")
        self.free_list = ArrayFreeQueue(num_blocks)
        self.ref_count = np.zeros(num_blocks, dtype=np.int64)
        self.enable_caching = enable_caching
        self.blocks_per_id = blocks_per_id
        self.cached_blocks: dict[tuple[int, Hashable], int] = {}  # run head key -> block
        self.head_key: dict[int, tuple[int, Hashable]] = {}  # block -> key, run heads only
        self.run_head = np.zeros(num_blocks, dtype=bool)  # the block is in head_key
        self.block_node = np.full(num_blocks, ROOT, dtype=np.int64)
        self.parent_node = np.full(num_blocks, ROOT, dtype=np.int64)
        self.run_next = np.full(num_blocks, NO_BLOCK, dtype=np.int64)
        # run head -> (the array of blocks it was cached with, its index there)
        self._run_blocks: dict[int, tuple[np.ndarray, int]] = {}
        self._next_node = ROOT + 1
        self._requests = self._queries = self._hits = self._reused = self._evicted = 0

    # -- queries -------------------------------------------------------------------------------

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding a cached prefix block, in use or not."""
        return int(np.count_nonzero(self.block_node != ROOT))

    def is_cached(self, block: int) -> bool:
        return bool(self.block_node[block] != ROOT)

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(self._requests, self._queries, self._hits, self._reused,
                                self._evicted)  # fmt: skip

    def _full_blocks(self, block_ids: Sequence[Hashable], num_tokens: int) -> int:
        """How many leading full blocks of the prompt have an identity."""
        ids = len(block_ids)
        if None in block_ids:
            ids = list(block_ids).index(None)
        return min(ids * self.blocks_per_id, num_tokens // self.block_size)

    def match_prefix(self, block_ids: Sequence[Hashable] | None, num_tokens: int) -> list[int]:
        """The cached blocks a prompt of `num_tokens` tokens would reuse, in order; changes nothing.

        At most the full blocks of num_tokens - 1 tokens: one prompt token is always computed.
        """
        if not self.enable_caching or not block_ids:
            return []
        limit = min(self._full_blocks(block_ids, num_tokens), (num_tokens - 1) // self.block_size)
        per, hits, node, block = self.blocks_per_id, [], ROOT, NO_BLOCK
        while len(hits) < limit:
            j = len(hits)
            if j % per:  # inside a run: the block cached after the previous one, if still there
                block = int(self.run_next[block])
                if not self._is_child(block, node):
                    break
                hits.append(block)
            else:
                block = self.cached_blocks.get((node, block_ids[j // per]))
                if block is None:
                    break
                hits += self._run_from(block, min(per, limit - j))
                block = hits[-1]
            node = int(self.block_node[block])
        return hits

    def _is_child(self, block: int, node: int) -> bool:
        """Whether `block` is cached now as the child of `node` (run_next pointers may be stale)."""
        if block == NO_BLOCK:
            return False
        return bool(self.parent_node[block] == node and self.block_node[block] != ROOT)

    def _run_from(self, head: int, n: int) -> list[int]:
        """The cached head of a run and up to n - 1 blocks cached with it that are still cached.

        A long run is checked in one array operation against the blocks cached with its head
        (their nodes are consecutive); blocks cached later after a partial eviction are then
        found one by one through run_next.
        """
        if self.blocks_per_id < VECTOR_RUN:
            return [head]
        cached_with, at = self._run_blocks[head]
        run = cached_with[at : at + n]
        node = int(self.block_node[head])
        same = self.block_node[run] == np.arange(node, node + len(run))
        k = len(run) if same.all() else int(np.argmin(same))
        if not k:
            raise AssertionError(f"the run of head {head} does not start at it")
        return run[:k].tolist()

    def _blocks_short(self, hits: list[int], num_tokens: int) -> int:
        """How many more blocks a prompt needs than the free list can give, after its hits."""
        revived = int(np.count_nonzero(self.ref_count[hits] == 0)) if hits else 0
        return self.blocks_for(num_tokens) - len(hits) - (len(self.free_list) - revived)

    def can_add_request(self, num_tokens: int = 0,
                        block_ids: Sequence[Hashable] | None = None) -> bool:  # fmt: skip
        return self._blocks_short(self.match_prefix(block_ids, num_tokens), num_tokens) <= 0

    # -- changes -------------------------------------------------------------------------------

    def add_request(self, rid: Hashable, num_tokens: int = 0,
                    block_ids: Sequence[Hashable] | None = None) -> int:  # fmt: skip
        """Start `rid` with a prompt of `num_tokens` tokens; returns how many came from the cache.

        Reuses the longest cached prefix of `block_ids`, takes new blocks for the rest (evicting
        the least recently freed cached blocks) and caches the prompt's new full blocks. All of
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
        shared = self._share(hits)
        new = self._take_blocks(self.blocks_for(num_tokens) - len(hits))
        self.tables[rid], self.lengths[rid] = hits + new.tolist(), num_tokens
        self._stored += num_tokens - shared * self.block_size
        if block_ids:
            full = self._full_blocks(block_ids, num_tokens)
            self._cache_blocks(hits[-1] if hits else NO_BLOCK, new[: full - len(hits)], block_ids,
                               len(hits))  # fmt: skip
        self._requests += 1
        self._queries += num_tokens
        self._hits += len(hits) * self.block_size
        return len(hits) * self.block_size

    def _share(self, hits: list[int]) -> int:
        """Give each hit block one more owner, pulling unowned ones out of the free list; returns
        how many already had an owner."""
        if not hits:
            return 0
        blocks = np.asarray(hits, dtype=np.int64)
        unowned = blocks[self.ref_count[blocks] == 0]
        self.free_list.remove_many(unowned)
        self.ref_count[blocks] += 1
        self._reused += len(unowned)
        return len(blocks) - len(unowned)

    def _take_block(self) -> int:
        block = super()._take_block()
        if self.block_node[block] != ROOT:
            self._evict(np.array([block], dtype=np.int64))
        return block

    def _take_blocks(self, n: int) -> np.ndarray:
        """n blocks from the front of the free list, owned once, evicted from the cache."""
        blocks = self.free_list.popleft_n(n)
        if self.ref_count[blocks].any():
            raise AssertionError(f"a free block still has owners: {blocks.tolist()}")
        self.ref_count[blocks] = 1
        cached = blocks[self.block_node[blocks] != ROOT]
        if len(cached):
            self._evict(cached)
        return blocks

    def _evict(self, blocks: np.ndarray) -> None:
        """Drop `blocks` (all cached) from the cache before they get new data."""
        heads = blocks[self.run_head[blocks]].tolist()
        deque(map(self.cached_blocks.__delitem__, map(self.head_key.pop, heads)), maxlen=0)
        if self.blocks_per_id >= VECTOR_RUN:
            deque(map(self._run_blocks.__delitem__, heads), maxlen=0)
        self.run_head[heads] = False
        self.block_node[blocks] = ROOT
        self._evicted += len(blocks)

    def _cache_blocks(self, before: int, blocks: np.ndarray, block_ids, start: int) -> None:
        """Cache `blocks`, the prompt's blocks start, start + 1, ..., chained after block `before`
        (the hit at start - 1, or NO_BLOCK at the start of the prompt).

        Stops at once if the first key is already cached: only the recomputed last block of a
        fully cached prompt can be, since every later key names a node handed out here.
        """
        count, per = len(blocks), self.blocks_per_id
        if not count:
            return
        node = int(self.block_node[before]) if start else ROOT
        if start % per == 0:
            if (node, block_ids[start // per]) in self.cached_blocks:
                return
        else:
            if self._is_child(int(self.run_next[before]), node):
                return
            self.run_next[before] = blocks[0]
        first = self._next_node
        self._next_node = first + count
        nodes = np.arange(first, first + count)
        self.block_node[blocks] = nodes
        self.parent_node[blocks[0]] = node
        self.parent_node[blocks[1:]] = nodes[:-1]
        inside = np.arange(start + 1, start + count) % per != 0  # next block in the same run
        self.run_next[blocks[:-1][inside]] = blocks[1:][inside]
        heads = np.arange((-start) % per, count, per)
        if len(heads):
            head_blocks = blocks[heads]
            keys = list(zip(self.parent_node[head_blocks].tolist(), block_ids[-(-start // per) :]))
            self.cached_blocks.update(zip(keys, head_blocks.tolist()))
            self.head_key.update(zip(head_blocks.tolist(), keys))
            self.run_head[head_blocks] = True
            if per >= VECTOR_RUN:  # each run as cached now: blocks[h : h + per], nodes + 0, 1, ..
                where = zip(repeat(blocks), heads.tolist())
                self._run_blocks.update(zip(head_blocks.tolist(), where))

    def free(self, rid: Hashable) -> None:
        """Finish `rid`; blocks no other table names join the back of the free list, tail first.

        Cached blocks keep their key there until evicted. With caching off this is the
        BlockManager's free (head first).
        """
        if not self.enable_caching:
            super().free(rid)
            return
        table, length = self.tables.pop(rid), self.lengths.pop(rid)
        if not table:
            return
        blocks = np.asarray(table[::-1], dtype=np.int64)  # tail first
        self.ref_count[blocks] -= 1
        freed = blocks[self.ref_count[blocks] == 0]
        tail_freed = int(self.ref_count[table[-1]] == 0)
        tail = length - (len(table) - 1) * self.block_size  # tokens in the last block
        self._stored -= (len(freed) - tail_freed) * self.block_size + tail_freed * tail
        self.free_list.extend(freed)

    # -- checking ------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """The BlockManager's invariants, plus the cache's.

        Every block is exactly one of free-uncached, free-cached (in LRU) or in use; each key
        maps to a cached run head holding that key, and each keyed block is in the map; cached
        nodes are distinct; a cached block in use is full in every table naming it; with caching
        off nothing is cached.
        """
        super().check_invariants()
        cached = np.flatnonzero(self.block_node != ROOT).tolist()
        keyed = sorted(self.head_key)
        if keyed != np.flatnonzero(self.run_head).tolist():
            raise AssertionError("run_head disagrees with head_key")
        for key, block in self.cached_blocks.items():
            if self.head_key.get(block) != key or not self.block_node[block]:
                raise AssertionError(f"key {key!r} maps to block {block}, which holds "
                                     f"{self.head_key.get(block)!r}")  # fmt: skip
        if len(keyed) != len(self.cached_blocks) or not set(keyed) <= set(cached):
            raise AssertionError(f"{len(keyed)} blocks carry a key, {len(self.cached_blocks)} keys")
        nodes = self.block_node[cached].tolist()
        if len(set(nodes)) != len(nodes) or (cached and not self.enable_caching):
            raise AssertionError(f"cached nodes {nodes} repeat, or caching is off")
        free = set(self.free_list)
        in_use = set(np.flatnonzero(self.ref_count > 0).tolist())
        free_cached = free.intersection(cached)
        if len(free - free_cached) + len(free_cached) + len(in_use) != self.num_blocks:
            raise AssertionError("blocks are not partitioned into free, free-cached and in use")
        for rid, table in self.tables.items():
            filled = self.lengths[rid] - (len(table) - 1) * self.block_size
            if table and self.block_node[table[-1]] and filled != self.block_size:
                raise AssertionError(f"{rid!r}: cached block {table[-1]} is not full")
