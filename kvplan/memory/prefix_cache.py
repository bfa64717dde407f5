"""Automatic prefix caching after vLLM v1's block pool: the pool, its metrics, the replay's manager.

`BlockPool` is vLLM's BlockPool (vllm/v1/core/block_pool.py) and the definition of the rules: the
step-by-step serve reference (kvplan/sim/reference.py) runs on it, the fast engine's flat arrays
(kvplan/sim/kernel.py) are checked against it event by event (tests/test_sim_prefix_pool.py), and
the prefix replay's `PrefixCachingBlockManager` takes its free queue, ref counts and counters from
it. The rules:
- Blocks 0 .. n - 1, each with a ref count: the requests holding it. With `null_block`, block 0 is
  vLLM's null block, out of the free queue for good (the pool hands out n - 1).
- Every block nobody holds waits in one free queue (free_queue.ArrayFreeQueue). New blocks come
  from its front (`get_new_blocks`), and a cached block met there is evicted on the way: its key
  is dropped. Freed blocks join the back in the order given, the first given evicted first
  (`free_blocks`); a request gives its blocks back tail first, so a shared head outlives the
  private tails behind it. The queue is thus also the LRU order of the cached blocks nobody holds.
- A full block is cached under a key (`cache_full_blocks`): any hashable naming the block's
  tokens and its whole prefix, as vLLM's chained block hash does (the serve engines pass trie
  nodes of chained hash ids, kvplan/sim/prefix_ids.py). Keys are compared, never only hashed.
  Copies are not merged: two requests that computed the same block both cache theirs, and a
  lookup takes the oldest copy still cached (vLLM keeps block tables append-only).
- A lookup (`match_prefix`) walks a prompt's keys from the first and stops at the first miss; the
  caller keeps one prompt token to compute (vLLM's max_cache_hit_length = prompt - 1). `touch`
  gives each hit one more holder, pulling one nobody held out of the middle of the queue in O(1).

The metrics, one name for each meaning (`PrefixCacheStats`, counted by the pool):
- lookups: requests looked up, each once, at its first admission.
- query_tokens: their prompt tokens.
- hit_tokens: of those, the tokens found cached at that first admission (vLLM's hits). Per
  request the same count is its hit_tokens (vLLM's num_cached_tokens).
- hit_rate: hit_tokens / query_tokens (vLLM's prefix cache hit rate).
- prefill_tokens_saved: prompt tokens found cached at every admission, the re-admissions of
  requests preempted by recompute included: the prefill not computed. Equal to hit_tokens where
  no request is admitted twice (the replay).
- blocks_evicted: cached blocks dropped from the cache because they were taken for new data.
- blocks_reused: hits on a cached block nobody held (pulled back out of the free queue).
Output keys are older than these names and frozen: the serve JSON's "prefix_cache" says
prefix_hit_rate for hit_rate (kvplan/sim/metrics.py), each request's "cached_tokens" is its
hit_tokens, and the prefix replay says requests, queries, hits for lookups, query_tokens,
hit_tokens (kvplan/replay/). The kernel's counters are PC_LOOKUPS, PC_QUERY_TOKENS (query_tokens),
PC_HIT_TOKENS (hit_tokens), PC_PREFILL_SAVED (prefill_tokens_saved), PC_BLOCKS_EVICTED and PC_BLOCKS_REUSED.

`PrefixCachingBlockManager` is the prefix replay's block manager: block tables (paged.BlockManager)
over a BlockPool, caching a prompt's full blocks when the request is added (a replay has no
steps). A cached block is named by a chained key (parent node, identity). The identity says what
the block's tokens are (a tuple of token ids, a trace's hash id: anything hashable); the parent
node names the cached block before it, so the key covers the whole prefix. Every block entering
the cache gets a fresh node number, never reused, so a key can only match a block whose whole
prefix is the request's own. Node 0 (ROOT) is the parent of a prompt's first block. It differs
from BlockPool in one rule: a key is never cached twice. When the whole prompt is cached its last
block is not reused (one token is computed) and the recomputed block is not cached again, where
vLLM would cache a second copy. Without copies a key chained on the parent block names the same
prefix as a hash chained on the parent's content.

Runs (`blocks_per_id` = k > 1): one identity names k consecutive blocks, as when a trace's hash
block of H tokens covers H / B simulated blocks; block j of the prompt is (ids[j // k], j % k).
Within a run the next block is implied by the previous one, so only a run's first block goes in
the key map; the others are found from their predecessor (`run_next`, checked against the
predecessor's node). Same results as k = 1 with identities (id, j % k) (tested), with a k-th of
the dict work. Tokens appended later (`append`, `append_tokens`: the output) have no identity and
are never cached.

With `enable_caching=False` every call behaves exactly as the plain BlockManager (tested on
random op sequences: same tables, same ref counts, same free-list order).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
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
    """The prefix cache's counters; each name is defined in the module docstring."""

    lookups: int = 0
    query_tokens: int = 0
    hit_tokens: int = 0
    prefill_tokens_saved: int = 0
    blocks_evicted: int = 0
    blocks_reused: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


class BlockPool:
    """vLLM v1's block pool: ref counts, one free queue in eviction order, full blocks cached by key.

    Per-block state is in numpy arrays indexed by block id, so that the replay's manager moves a
    request's blocks in a few array operations; the serve reference hands it short lists.
    `block_hash[b]` is the key of cached block b; `cached_block_hash_to_block[key]` its copies,
    oldest first (a dict used as an ordered set, as vLLM's). Subclasses with their own index of
    cached blocks override `_evict`.
    """

    def __init__(self, num_blocks: int, *, null_block: bool = False) -> None:
        if num_blocks < int(null_block):
            raise ValueError(f"a pool of {num_blocks} blocks cannot keep a null block")
        self.num_blocks = num_blocks
        self.free_list = ArrayFreeQueue(num_blocks)
        self.ref_count = np.zeros(num_blocks, dtype=np.int64)
        self.null_block = int(self.free_list.popleft()) if null_block else None
        self.block_hash: dict[int, Hashable] = {}
        self.cached_block_hash_to_block: dict[Hashable, dict[int, None]] = {}
        self.lookups = self.query_tokens = self.hit_tokens = self.prefill_tokens_saved = 0
        self.blocks_evicted = self.blocks_reused = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks nobody holds (cached or not): what get_new_blocks can hand out."""
        return len(self.free_list)

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(self.lookups, self.query_tokens, self.hit_tokens,
                                self.prefill_tokens_saved, self.blocks_evicted, self.blocks_reused)

    # -- queries -------------------------------------------------------------------------------

    def get_cached_block(self, key: Hashable) -> int | None:
        """The oldest cached copy of `key`, or None."""
        copies = self.cached_block_hash_to_block.get(key)
        return next(iter(copies)) if copies else None

    def match_prefix(self, keys: Sequence[Hashable]) -> list[int]:
        """The blocks of the longest cached prefix of `keys`, the oldest copy of each; changes nothing."""
        hits = []
        for key in keys:
            copies = self.cached_block_hash_to_block.get(key)
            if not copies:
                break
            hits.append(next(iter(copies)))
        return hits

    def num_unheld(self, blocks) -> int:
        """How many of `blocks` nobody holds: touching them takes them out of the free queue."""
        return int(np.count_nonzero(self.ref_count[blocks] == 0)) if len(blocks) else 0

    # -- changes -------------------------------------------------------------------------------

    def touch(self, blocks) -> int:
        """Each of `blocks` (distinct, hit by a request) gains a holder; those nobody held leave the
        free queue. Returns how many those were (blocks_reused)."""
        if not len(blocks):
            return 0
        blocks = np.asarray(blocks, dtype=np.int64)
        unheld = blocks[self.ref_count[blocks] == 0]
        self.free_list.remove_many(unheld)
        self.ref_count[blocks] += 1
        self.blocks_reused += len(unheld)
        return len(unheld)

    def get_new_blocks(self, n: int) -> np.ndarray:
        """n blocks from the front of the free queue, held once each; the cached ones are evicted."""
        blocks = self.free_list.popleft_n(n)
        if self.ref_count[blocks].any():
            raise AssertionError(f"a free block still has holders: {blocks.tolist()}")
        self.ref_count[blocks] = 1
        self._evict(blocks)
        return blocks

    def _evict(self, blocks: np.ndarray) -> None:
        """Drop the cached ones of `blocks` (just taken for new data) from the cache."""
        if not self.block_hash:
            return
        for block in blocks.tolist():
            key = self.block_hash.pop(block, None)
            if key is None:
                continue
            copies = self.cached_block_hash_to_block[key]
            del copies[block]
            if not copies:
                del self.cached_block_hash_to_block[key]
            self.blocks_evicted += 1

    def cache_full_blocks(self, blocks: Sequence[int], keys: Sequence[Hashable]) -> None:
        """Cache each of `blocks` (held, full, not cached yet) under its key, as its newest copy."""
        for block, key in zip(blocks, keys):
            if block in self.block_hash or not self.ref_count[block]:
                raise AssertionError(f"block {block} is cached already or held by nobody")
            self.block_hash[block] = key
            self.cached_block_hash_to_block.setdefault(key, {})[block] = None

    def free_blocks(self, ordered) -> np.ndarray:
        """Each of `ordered` (distinct) loses a holder; those left with none join the back of the free
        queue in this order, the first to be evicted first. Returns those."""
        blocks = np.asarray(ordered, dtype=np.int64)
        self.ref_count[blocks] -= 1
        freed = blocks[self.ref_count[blocks] == 0]
        self.free_list.extend(freed)
        return freed

    def count_admission(self, prompt_tokens: int, hit_tokens: int, first: bool = True) -> None:
        """A request is admitted with `hit_tokens` of its prompt found cached: prefill_tokens_saved
        always; at its first admission also a lookup, its query and hit tokens (vLLM's hit rate)."""
        self.prefill_tokens_saved += hit_tokens
        if first:
            self.lookups += 1
            self.query_tokens += prompt_tokens
            self.hit_tokens += hit_tokens

    # -- checking ------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Every block is exactly one of: the null block, free (no holder, in the queue once) or
        held; the key map and block_hash name the same cached blocks; the null block is never
        cached."""
        listed = list(self.free_list)
        if len(listed) != len(set(listed)) or len(listed) != len(self.free_list):
            raise AssertionError(f"free list is inconsistent: {listed}")
        free = np.zeros(self.num_blocks, dtype=bool)
        free[listed] = True
        held = self.ref_count > 0
        if (self.ref_count < 0).any() or (free & held).any():
            raise AssertionError("a block is free and held, or held a negative number of times")
        null = np.zeros(self.num_blocks, dtype=bool)
        if self.null_block is not None:
            null[self.null_block] = True
        if ((free | held) == null).any():
            raise AssertionError("a block is neither free nor held, or the null block is in use")
        pairs = {(b, k) for k, copies in self.cached_block_hash_to_block.items() for b in copies}
        if pairs != set(self.block_hash.items()) or self.null_block in self.block_hash:
            raise AssertionError("the key map and block_hash disagree")


class _RunPool(BlockPool):
    """A PrefixCachingBlockManager's pool: BlockPool's queue, ref counts and counters, whose
    cached blocks are the ones the manager's chained runs name."""

    def __init__(self, manager: PrefixCachingBlockManager) -> None:
        super().__init__(manager.num_blocks)
        self.manager = manager

    def _evict(self, blocks: np.ndarray) -> None:
        cached = blocks[self.manager.block_node[blocks] != ROOT]
        if len(cached):
            self.manager._uncache(cached)
            self.blocks_evicted += len(cached)


class PrefixCachingBlockManager(BlockManager):
    """A BlockManager whose full prompt blocks outlive their request as a shared LRU cache.

    `add_request(rid, num_tokens, block_ids)` takes the prompt's identities, one per run of
    `blocks_per_id` full blocks (fewer is fine: the rest of the prompt is unique to the request,
    as is a prompt without ids; a None ends the ids). Everything else (append, append_tokens,
    fork, slot_of, can_append) is the BlockManager's. The free list, ref counts and counters are
    the pool's (`pool`, a BlockPool). The cache index is in numpy arrays indexed by block id:
    `block_node` (its node while cached, else ROOT); `parent_node`; `run_next` (the block cached
    after it in its run); `run_head`. `cached_blocks` maps a run head's key to the block and
    `head_key` the block back to its key.
    """

    def __init__(self, num_blocks: int, block_size: int, *, enable_caching: bool = True,
                 blocks_per_id: int = 1) -> None:  # fmt: skip
        super().__init__(num_blocks, block_size)
        if blocks_per_id < 1:
            raise ValueError(f"blocks_per_id must be >= 1, got {blocks_per_id}")
        self.block_node = np.full(num_blocks, ROOT, dtype=np.int64)
        self.pool = _RunPool(self)
        self.free_list, self.ref_count = self.pool.free_list, self.pool.ref_count
        self.enable_caching = enable_caching
        self.blocks_per_id = blocks_per_id
        self.cached_blocks: dict[tuple[int, Hashable], int] = {}  # run head key -> block
        self.head_key: dict[int, tuple[int, Hashable]] = {}  # block -> key, run heads only
        self.run_head = np.zeros(num_blocks, dtype=bool)  # the block is in head_key
        self.parent_node = np.full(num_blocks, ROOT, dtype=np.int64)
        self.run_next = np.full(num_blocks, NO_BLOCK, dtype=np.int64)
        # run head -> (the array of blocks it was cached with, its index there)
        self._run_blocks: dict[int, tuple[np.ndarray, int]] = {}
        self._next_node = ROOT + 1

    # -- queries -------------------------------------------------------------------------------

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding a cached prefix block, in use or not."""
        return int(np.count_nonzero(self.block_node != ROOT))

    def is_cached(self, block: int) -> bool:
        return bool(self.block_node[block] != ROOT)

    def stats(self) -> PrefixCacheStats:
        return self.pool.stats()

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
        revived = self.pool.num_unheld(hits)
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
        shared = len(hits) - self.pool.touch(hits)  # hits some table named already
        new = self.pool.get_new_blocks(self.blocks_for(num_tokens) - len(hits))
        self.tables[rid], self.lengths[rid] = hits + new.tolist(), num_tokens
        self._stored += num_tokens - shared * self.block_size
        if block_ids:
            full = self._full_blocks(block_ids, num_tokens)
            self._cache_blocks(hits[-1] if hits else NO_BLOCK, new[: full - len(hits)], block_ids,
                               len(hits))  # fmt: skip
        hit_tokens = len(hits) * self.block_size
        self.pool.count_admission(num_tokens, hit_tokens)
        return hit_tokens

    def _take_block(self) -> int:
        return int(self.pool.get_new_blocks(1)[0])

    def _uncache(self, blocks: np.ndarray) -> None:
        """Drop `blocks` (all cached) from the index: the pool took them for new data."""
        heads = blocks[self.run_head[blocks]].tolist()
        deque(map(self.cached_blocks.__delitem__, map(self.head_key.pop, heads)), maxlen=0)
        if self.blocks_per_id >= VECTOR_RUN:
            deque(map(self._run_blocks.__delitem__, heads), maxlen=0)
        self.run_head[heads] = False
        self.block_node[blocks] = ROOT

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
        freed = self.pool.free_blocks(table[::-1])  # tail first
        tail_freed = int(self.ref_count[table[-1]] == 0)
        tail = length - (len(table) - 1) * self.block_size  # tokens in the last block
        self._stored -= (len(freed) - tail_freed) * self.block_size + tail_freed * tail

    # -- checking ------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """The BlockManager's invariants, the pool's, and the index's.

        Each key maps to a cached run head holding that key, and each keyed block is in the map;
        cached nodes are distinct; a cached block in use is full in every table naming it; with
        caching off nothing is cached.
        """
        super().check_invariants()
        self.pool.check_invariants()
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
        for rid, table in self.tables.items():
            filled = self.lengths[rid] - (len(table) - 1) * self.block_size
            if table and self.block_node[table[-1]] and filled != self.block_size:
                raise AssertionError(f"{rid!r}: cached block {table[-1]} is not full")
