"""vLLM's block pool and the prefix-caching block manager: hand-worked literals, collisions, runs,
random invariants."""

from __future__ import annotations

import random
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from kvplan.memory.paged import BlockManager, FreeBlockQueue, OutOfBlocks
from kvplan.memory.prefix_cache import ROOT, ArrayFreeQueue, BlockPool, PrefixCachingBlockManager


def refs(mgr) -> list[int]:
    return mgr.ref_count.tolist()


def cached(mgr) -> list[int]:
    return [b for b in range(mgr.num_blocks) if mgr.is_cached(b)]


# ---- the block pool -------------------------------------------------------------------------


def test_block_pool_keeps_the_null_block_and_frees_in_the_order_given():
    """Fails if the null block is handed out, or freed blocks do not join the back in the order
    given (a table tail first), or a hit nobody holds does not leave the queue and count as reused."""
    pool = BlockPool(5, null_block=True)
    assert pool.null_block == 0 and list(pool.free_list) == [1, 2, 3, 4] and pool.num_free_blocks == 4
    table = pool.get_new_blocks(3).tolist()
    assert table == [1, 2, 3] and pool.ref_count.tolist() == [0, 1, 1, 1, 0]
    pool.cache_full_blocks(table[:2], ["a", "ab"])
    pool.free_blocks(table[::-1])
    assert list(pool.free_list) == [4, 3, 2, 1]  # the shared head last: evicted last
    assert pool.match_prefix(["a", "ab", "abc"]) == [1, 2] and pool.match_prefix(["b"]) == []
    assert pool.num_unheld([1, 2]) == 2
    assert pool.touch([1, 2]) == 2 and list(pool.free_list) == [4, 3]
    assert pool.touch([1]) == 0 and pool.ref_count[1] == 2
    assert pool.stats().blocks_reused == 2
    pool.check_invariants()


def test_block_pool_keeps_copies_and_serves_the_oldest():
    """Fails if two blocks computed with the same key are merged, a lookup does not take the oldest
    copy still cached, or evicting one copy drops the other."""
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(1).tolist() + pool.get_new_blocks(1).tolist()
    pool.cache_full_blocks([a], ["k"])
    pool.cache_full_blocks([b], ["k"])
    assert pool.get_cached_block("k") == a and list(pool.cached_block_hash_to_block["k"]) == [a, b]
    pool.free_blocks([a])
    pool.free_blocks([b])
    assert list(pool.free_list) == [2, 3, a, b]
    assert pool.get_new_blocks(3).tolist() == [2, 3, a]  # a evicted on the way, b still cached
    assert pool.get_cached_block("k") == b and pool.stats().blocks_evicted == 1
    pool.check_invariants()


def test_block_pool_counts_first_admissions_and_every_saved_prefill():
    """Fails if a re-admission counts in the hit rate, or its hits are not prefill saved."""
    pool = BlockPool(2)
    pool.count_admission(12, 8)
    pool.count_admission(13, 8, first=False)  # re-admitted after a recompute preemption
    s = pool.stats()
    assert (s.lookups, s.query_tokens, s.hit_tokens, s.prefill_tokens_saved) == (1, 12, 8, 16)
    assert s.hit_rate == pytest.approx(8 / 12)


class PlainPool:
    """vLLM's block pool one block at a time in an OrderedDict: the oracle for BlockPool."""

    def __init__(self, num_blocks: int, null_block: bool) -> None:
        self.queue = OrderedDict.fromkeys(range(int(null_block), num_blocks))
        self.ref = [0] * num_blocks
        self.key: dict[int, object] = {}
        self.copies: dict[object, list[int]] = {}
        self.evicted = self.reused = 0

    def take(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            b, _ = self.queue.popitem(last=False)
            if b in self.key:
                self.copies[self.key[b]].remove(b)
                if not self.copies[self.key[b]]:
                    del self.copies[self.key.pop(b)]
                else:
                    del self.key[b]
                self.evicted += 1
            self.ref[b] = 1
            out.append(b)
        return out

    def touch(self, blocks) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                del self.queue[b]
                self.reused += 1
            self.ref[b] += 1

    def free(self, ordered) -> None:
        for b in ordered:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.queue[b] = None


@pytest.mark.parametrize("seed", range(30))
def test_block_pool_equals_a_plain_pool_on_random_ops(seed):
    """Fails if BlockPool's free order, ref counts, copies, lookups or counters ever differ from
    the block-by-block model on random take / cache / lookup-and-touch / free sequences."""
    rng = random.Random(seed)
    n, null = rng.randint(1, 12), rng.random() < 0.5
    n += null
    pool, plain = BlockPool(n, null_block=null), PlainPool(n, null)
    tables: list[list[int]] = []
    for _ in range(300):
        op = rng.choice(["take", "hit", "cache", "free"])
        if op == "take" and plain.queue:
            k = rng.randint(0, len(plain.queue))
            got = pool.get_new_blocks(k).tolist()
            assert got == plain.take(k)
            tables.append(got)
        elif op == "hit":
            chain = tuple(rng.choices("ab", k=3))  # a prompt's keys: its prefixes, distinct
            keys = [chain[:j + 1] for j in range(rng.randint(1, 3))]
            hits = pool.match_prefix(keys)
            expect = []
            for key in keys:
                if key not in plain.copies:
                    break
                expect.append(plain.copies[key][0])
            assert hits == expect
            pool.touch(hits)
            plain.touch(hits)
            tables.append(list(hits))
        elif op == "cache" and tables:
            table = rng.choice(tables)
            new = [b for b in table if b not in plain.key]
            keys = [tuple(rng.choices("ab", k=rng.randint(1, 3))) for _ in new]
            pool.cache_full_blocks(new, keys)
            for b, key in zip(new, keys):
                plain.key[b] = key
                plain.copies.setdefault(key, []).append(b)
        elif op == "free" and tables:
            table = tables.pop(rng.randrange(len(tables)))
            pool.free_blocks(table[::-1])
            plain.free(table[::-1])
        assert list(pool.free_list) == list(plain.queue) and pool.ref_count.tolist() == plain.ref
        assert {k: list(v) for k, v in pool.cached_block_hash_to_block.items()} == plain.copies
        assert (pool.blocks_evicted, pool.blocks_reused) == (plain.evicted, plain.reused)
        pool.check_invariants()


# ---- hand-worked literals (B = 4, a pool of 5 blocks) ---------------------------------------


def test_two_requests_share_a_two_block_prefix():
    """Fails if a hit does not reuse the cached blocks, add an owner, or count its tokens."""
    mgr = PrefixCachingBlockManager(5, 4)
    assert mgr.add_request("A", 10, ["p0", "p1"]) == 0
    assert mgr.tables["A"] == [0, 1, 2] and list(mgr.free_list) == [3, 4]
    assert cached(mgr) == [0, 1]  # block 2 holds 2 tokens: never cached
    assert mgr.add_request("B", 9, ["p0", "p1"]) == 8
    assert mgr.tables["B"] == [0, 1, 3]
    assert refs(mgr) == [2, 2, 1, 1, 0] and list(mgr.free_list) == [4]
    s = mgr.stats()
    assert (s.lookups, s.query_tokens, s.hit_tokens, s.blocks_reused) == (2, 19, 8, 0)
    assert s.prefill_tokens_saved == s.hit_tokens  # nothing is admitted twice
    assert s.hit_rate == pytest.approx(8 / 19)
    assert mgr.num_stored_tokens == 10 + 1  # B's own token in block 3; the prefix counted once
    mgr.check_invariants()


def test_freed_blocks_stay_cached_tail_first_and_the_lru_one_is_evicted():
    """Fails if freeing loses cached keys, returns blocks head first, or evicts the wrong block."""
    mgr = PrefixCachingBlockManager(5, 4)
    mgr.add_request("A", 10, ["p0", "p1"])
    mgr.add_request("B", 9, ["p0", "p1"])
    mgr.free("A")
    assert list(mgr.free_list) == [3, 4, 2][1:]  # 1 and 0 still have B; A's block 2 goes back
    mgr.free("B")
    assert list(mgr.free_list) == [4, 2, 3, 1, 0]  # tail first: the shared head is freed last
    assert refs(mgr) == [0] * 5 and cached(mgr) == [0, 1]
    assert mgr.add_request("C", 13, ["c0", "c1", "c2"]) == 0
    assert mgr.tables["C"] == [4, 2, 3, 1]  # the front of the free list, evicting block 1 (p1)
    assert mgr.stats().blocks_evicted == 1 and list(mgr.free_list) == [0]
    assert cached(mgr) == [0, 2, 3, 4]  # p0 survives; C's three full blocks are cached
    mgr.free("C")
    assert list(mgr.free_list) == [0, 1, 3, 2, 4]
    assert mgr.add_request("D", 9, ["p0", "p1"]) == 4  # p0 hits (pulled from the front), p1 is gone
    assert mgr.tables["D"] == [0, 1, 3] and list(mgr.free_list) == [2, 4]
    s = mgr.stats()
    assert (s.blocks_reused, s.blocks_evicted) == (1, 2)  # block 3 held c1
    mgr.check_invariants()


def test_a_fully_cached_prompt_recomputes_its_last_block():
    """Fails if a prompt that is all cached blocks is served entirely from the cache (vLLM computes
    at least one token) or if its recomputed last block is cached a second time."""
    mgr = PrefixCachingBlockManager(6, 4)
    mgr.add_request("A", 8, ["p0", "p1"])
    mgr.free("A")
    assert mgr.add_request("B", 8, ["p0", "p1"]) == 4
    assert mgr.tables["B"] == [0, 2] and cached(mgr) == [0, 1]
    mgr.check_invariants()


def test_a_hash_collision_does_not_share():
    """Fails if blocks are matched by hash alone: (0, -1) and (0, -2) hash equal in CPython."""
    assert hash((ROOT, -1)) == hash((ROOT, -2))
    mgr = PrefixCachingBlockManager(6, 4)
    mgr.add_request("A", 5, [-1])
    assert mgr.add_request("B", 5, [-2]) == 0
    assert mgr.tables["B"] == [2, 3]

    class Same:
        def __init__(self, value):
            self.value = value

        def __hash__(self):
            return 7

        def __eq__(self, other):
            return isinstance(other, Same) and other.value == self.value

    mgr = PrefixCachingBlockManager(6, 4)
    mgr.add_request("A", 5, [Same(1)])
    assert mgr.add_request("B", 5, [Same(2)]) == 0
    assert mgr.add_request("C", 5, [Same(1)]) == 4
    mgr.check_invariants()


def test_keys_are_chained_through_the_whole_prefix():
    """Fails if a block is matched by its own tokens when the blocks before it differ."""
    mgr = PrefixCachingBlockManager(8, 4)
    mgr.add_request("A", 9, ["x", "same"])
    assert mgr.add_request("B", 9, ["y", "same"]) == 0
    assert mgr.add_request("C", 9, ["x", "same"]) == 8


def test_tokens_after_a_missing_or_none_id_are_never_cached():
    """Fails if a block after a unique (None) block is cached or matched."""
    mgr = PrefixCachingBlockManager(8, 4)
    mgr.add_request("A", 13, ["a", None, "c"])
    assert cached(mgr) == [0]
    assert mgr.add_request("B", 13, ["a", None, "c"]) == 4


def test_out_of_blocks_changes_nothing_and_counts_revived_hits():
    """Fails if a refused add changes state, or if the check forgets that reviving a free cached
    block takes it out of the free list."""
    mgr = PrefixCachingBlockManager(3, 4)
    mgr.add_request("A", 8, ["p0", "p1"])
    mgr.free("A")
    # p0 hits a free block: 3 blocks needed in all, but only 3 exist, one of them the hit itself.
    assert mgr.can_add_request(12, ["p0", "zz", "zz"])
    assert not mgr.can_add_request(13, ["p0", "zz", "zz"])
    before = (list(mgr.free_list), refs(mgr), cached(mgr), mgr.stats())
    with pytest.raises(OutOfBlocks):
        mgr.add_request("B", 13, ["p0", "zz", "zz"])
    assert (list(mgr.free_list), refs(mgr), cached(mgr), mgr.stats()) == before
    mgr.check_invariants()


def test_runs_of_blocks_per_id():
    """Fails if one id covering k blocks does not behave as k ids (id, 0) .. (id, k - 1), or if a
    run cut short by eviction is matched past its surviving head."""
    mgr = PrefixCachingBlockManager(6, 4, blocks_per_id=2)
    mgr.add_request("A", 9, ["h0", "h1"])  # blocks 0..1 are h0, block 2 is h1's first half
    assert mgr.tables["A"] == [0, 1, 2] and cached(mgr) == [0, 1]
    mgr.free("A")  # free list 3 4 5 2 1 0
    mgr.add_request("X", 16)  # takes 3 4 5 2, no eviction of cached blocks
    mgr.add_request("Y", 1)  # takes block 1: h0's second half is evicted
    assert cached(mgr) == [0]
    mgr.free("X")
    mgr.free("Y")
    assert mgr.add_request("B", 17, ["h0", "h1"]) == 4
    mgr.check_invariants()


# ---- the free list --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_array_free_queue_matches_the_linked_free_queue(seed):
    """Fails if ArrayFreeQueue ever differs from FreeBlockQueue in order, length or membership,
    including across compactions of its array."""
    rng = random.Random(seed)
    n = rng.randint(0, 12)
    ref, arr = FreeBlockQueue(n), ArrayFreeQueue(n)
    for _ in range(400):
        op = rng.choice(["pop", "popn", "append", "extend", "remove"])
        queued = list(ref)
        out = [b for b in range(n) if b not in ref]
        if op == "pop" and queued:
            assert arr.popleft() == ref.popleft()
        elif op == "popn":
            k = rng.randint(0, len(queued))
            assert arr.popleft_n(k).tolist() == [ref.popleft() for _ in range(k)]
        elif op == "append" and out:
            b = rng.choice(out)
            ref.append(b)
            arr.append(b)
        elif op == "extend":
            rng.shuffle(out)
            blocks = out[: rng.randint(0, len(out))]
            for b in blocks:
                ref.append(b)
            arr.extend(np.asarray(blocks, dtype=np.int64))
        elif op == "remove" and queued:
            b = rng.choice(queued)
            ref.remove(b)
            arr.remove(b)
        assert list(arr) == list(ref) and len(arr) == len(ref)
        assert [b in arr for b in range(n)] == [b in ref for b in range(n)]
    if len(ref):
        with pytest.raises(ValueError):
            arr.extend(np.asarray(list(ref)[:1], dtype=np.int64))  # already queued
    if len(ref) < n:
        with pytest.raises(ValueError):
            arr.remove(next(b for b in range(n) if b not in ref))  # not queued


# ---- randomized: caching off equals BlockManager; runs equal expanded ids ------------------


def random_ops(rng: random.Random, block_size: int, steps: int, max_blocks: int = 4):
    """A random op sequence: (op, rid, n, ids) tuples over a small id alphabet (lots of sharing)."""
    live, next_rid = [], 0
    for _ in range(steps):
        op = rng.choices(["add", "append", "bulk", "fork", "free"], [4, 4, 2, 1, 3])[0]
        if op != "add" and not live:
            op = "add"
        if op == "add":
            n = rng.randint(0, max_blocks * block_size)
            ids = [rng.randint(0, 2) for _ in range(rng.randint(0, 4))]
            yield op, next_rid, n, ids
            live.append(next_rid)
            next_rid += 1
        elif op == "fork":
            yield op, rng.choice(live), next_rid, None
            live.append(next_rid)
            next_rid += 1
        elif op == "free":
            rid = rng.choice(live)
            live.remove(rid)
            yield op, rid, 0, None
        else:
            yield op, rng.choice(live), rng.randint(1, 2 * block_size) if op == "bulk" else 1, None


def apply(mgr, op, rid, n, ids) -> bool:
    """Apply one op; False when it was refused for lack of blocks (the op is then skipped)."""
    try:
        if op == "add":
            if isinstance(mgr, PrefixCachingBlockManager):
                mgr.add_request(rid, n, ids)
            else:
                mgr.add_request(rid, n)
        elif op == "append":
            mgr.append(rid)
        elif op == "bulk":
            mgr.append_tokens(rid, n)
        elif op == "fork":
            mgr.fork(rid, n)
        else:
            mgr.free(rid)
    except OutOfBlocks:
        return False
    return True


def state(mgr):
    return (dict(mgr.tables), dict(mgr.lengths), [int(r) for r in mgr.ref_count],
            list(mgr.free_list), mgr.num_stored_tokens)  # fmt: skip


@pytest.mark.parametrize("seed", range(30))
def test_caching_off_is_the_block_manager_exactly(seed):
    """Fails if enable_caching=False changes any table, ref count, length or the free-list order."""
    rng = random.Random(seed)
    size = rng.choice([1, 2, 4])
    plain = BlockManager(rng.randint(1, 16), size)
    off = PrefixCachingBlockManager(plain.num_blocks, size, enable_caching=False)
    skip = set()
    for op, rid, n, ids in random_ops(rng, size, 300):
        if rid in skip or (op == "fork" and n in skip):
            skip.add(n if op == "fork" else rid)
            continue
        done = apply(plain, op, rid, n, ids)
        assert apply(off, op, rid, n, ids) == done
        if not done and op == "add":
            skip.add(rid)
        assert state(off) == state(plain)
    off.check_invariants()
    assert off.num_cached_blocks == 0


@pytest.mark.parametrize("seed", range(30))
def test_runs_equal_their_expanded_ids(seed):
    """Fails if blocks_per_id = k gives other tables, free order or counts than k = 1 with the
    identities (id, 0), ..., (id, k - 1) spelled out."""
    rng = random.Random(seed)
    size, per = rng.choice([1, 2, 4]), rng.choice([2, 3, 8, 9])  # 8, 9: runs matched as arrays
    num = rng.randint(4, 12 * per)
    runs = PrefixCachingBlockManager(num, size, blocks_per_id=per)
    flat = PrefixCachingBlockManager(num, size)
    skip = set()
    for op, rid, n, ids in random_ops(rng, size, 300, max_blocks=4 * per):
        if rid in skip or (op == "fork" and n in skip):
            skip.add(n if op == "fork" else rid)
            continue
        expanded = [(h, s) for h in ids for s in range(per)] if ids is not None else None
        done = apply(runs, op, rid, n, ids)
        assert apply(flat, op, rid, n, expanded) == done
        if not done and op == "add":
            skip.add(rid)
        assert state(runs) == state(flat) and runs.stats() == flat.stats()
        assert cached(runs) == cached(flat)
        runs.check_invariants()


# ---- randomized invariants with data: requests read back their own tokens ------------------


class Harness:
    """Random ops on a caching manager whose prompts are token ids; a numpy pool holds each slot's
    token, written only where the manager did not serve it from the cache."""

    def __init__(self, rng: random.Random, num_blocks: int, block_size: int) -> None:
        self.rng, self.mgr = rng, PrefixCachingBlockManager(num_blocks, block_size)
        self.pool = np.full((num_blocks, block_size), -1, dtype=np.int64)
        self.expected: dict[int, list[int]] = {}
        self.next_rid, self.unique = 0, -10

    def add(self, tokens: list[int]) -> None:
        mgr, b = self.mgr, self.mgr.block_size
        ids = [tuple(tokens[i : i + b]) for i in range(0, len(tokens) - b + 1, b)]
        rid = self.next_rid
        try:
            served = mgr.add_request(rid, len(tokens), ids)
        except OutOfBlocks:
            return
        self.next_rid += 1
        self.expected[rid] = list(tokens)
        for pos in range(served, len(tokens)):
            self.pool[mgr.slot_of(rid, pos)] = tokens[pos]

    def append(self, rid: int, n: int) -> None:
        copy = self.mgr.append_tokens(rid, n) if n > 1 else self.mgr.append(rid).copy
        if copy is not None:
            self.pool[copy[1]] = self.pool[copy[0]]
        for _ in range(n):
            self.unique -= 1
            pos = len(self.expected[rid])
            self.expected[rid].append(self.unique)
            self.pool[self.mgr.slot_of(rid, pos)] = self.unique

    def check(self) -> None:
        mgr = self.mgr
        mgr.check_invariants()
        for rid, tokens in self.expected.items():
            got = [int(self.pool[mgr.slot_of(rid, p)]) for p in range(len(tokens))]
            assert got == tokens, rid
        for (_, identity), block in mgr.cached_blocks.items():  # no stale key: content matches
            assert tuple(self.pool[block].tolist()) == identity


def harness_step(h: Harness) -> None:
    rng, live = h.rng, list(h.expected)
    op = rng.choices(["add", "append", "fork", "free"], [4, 4, 1, 3])[0]
    if op != "add" and not live:
        op = "add"
    if op == "add":
        h.add([rng.randint(0, 1) for _ in range(rng.randint(0, 4 * h.mgr.block_size))])
        return
    rid = rng.choice(live)
    try:
        if op == "append":
            h.append(rid, rng.choice([1, 1, rng.randint(2, 2 * h.mgr.block_size)]))
        elif op == "fork":
            h.mgr.fork(rid, h.next_rid)
            h.expected[h.next_rid] = list(h.expected[rid])
            h.next_rid += 1
        else:
            h.mgr.free(rid)
            del h.expected[rid]
    except OutOfBlocks:
        pass


@pytest.mark.parametrize("seed", range(40))
def test_random_ops_keep_every_invariant_and_every_token(seed):
    """Fails if any op mix shares a block with the wrong tokens, hands out a cached block while its
    key still maps to it, loses or double-books a block, or breaks the free/cached/in-use split."""
    rng = random.Random(seed)
    h = Harness(rng, rng.randint(2, 14), rng.choice([1, 2, 3, 4]))
    for _ in range(500):
        harness_step(h)
        h.check()
    s = h.mgr.stats()
    assert 0 <= s.hit_tokens <= s.query_tokens


class PrefixCacheMachine(RuleBasedStateMachine):
    """Hypothesis-driven version of the harness: shrinking finds the shortest breaking sequence."""

    requests = Bundle("requests")

    @initialize(num_blocks=st.integers(1, 10), block_size=st.sampled_from([1, 2, 3, 4]))
    def start(self, num_blocks, block_size):
        self.h = Harness(random.Random(0), num_blocks, block_size)

    @rule(target=requests, tokens=st.lists(st.integers(0, 1), max_size=12))
    def add(self, tokens):
        rid = self.h.next_rid
        self.h.add(tokens)
        return rid if rid in self.h.expected else -1

    @rule(rid=requests, n=st.integers(1, 6))
    def append(self, rid, n):
        if rid in self.h.expected:
            try:
                self.h.append(rid, n)
            except OutOfBlocks:
                pass

    @rule(rid=requests)
    def fork(self, rid):
        if rid in self.h.expected:
            self.h.mgr.fork(rid, self.h.next_rid)
            self.h.expected[self.h.next_rid] = list(self.h.expected[rid])
            self.h.next_rid += 1

    @rule(rid=consumes(requests))
    def free(self, rid):
        if rid in self.h.expected:
            self.h.mgr.free(rid)
            del self.h.expected[rid]

    @invariant()
    def consistent(self):
        if hasattr(self, "h"):
            self.h.check()


PrefixCacheMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
test_prefix_cache_state_machine = PrefixCacheMachine.TestCase
test_prefix_cache_state_machine.__doc__ = (
    "Fails if some op sequence breaks a cache invariant or makes a request read another's tokens.")
