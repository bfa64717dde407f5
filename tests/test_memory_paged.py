"""BlockManager: the lesson's tables as literals, reading K/V through the table, invariants under random ops."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvplan.memory.paged import BlockManager, FreeBlockQueue, OutOfBlocks, TokenWrite


def snapshot(mgr: BlockManager):
    """Everything a failed call must leave untouched."""
    return ({r: list(t) for r, t in mgr.tables.items()}, dict(mgr.lengths), list(mgr.ref_count),
            list(mgr.free_list), mgr.wasted_slots())


# -- the lesson's hand-worked example ------------------------------------------------------------

def grow(mgr: BlockManager, rid, n: int, mode: str) -> None:
    """Give `rid` n more tokens: in one add_request, one append_tokens, or one append at a time."""
    if rid not in mgr.tables:
        if mode == "add":
            mgr.add_request(rid, n)
            return
        mgr.add_request(rid)
    if mode == "one-by-one":
        for _ in range(n):
            mgr.append(rid)
    else:
        mgr.append_tokens(rid, n)


HAND_WORKED = [  # (event, tokens of A, B, C, block tables, free list, wasted slots), the lesson's table
    (None, (None, None, None), {}, [0, 1, 2, 3, 4, 5, 6, 7], 0),
    (("A", 6), (6, None, None), {"A": [0, 1]}, [2, 3, 4, 5, 6, 7], 2),
    (("B", 3), (6, 3, None), {"A": [0, 1], "B": [2]}, [3, 4, 5, 6, 7], 3),
    (("C", 5), (6, 3, 5), {"A": [0, 1], "B": [2], "C": [3, 4]}, [5, 6, 7], 6),
    (("A", 2), (8, 3, 5), {"A": [0, 1], "B": [2], "C": [3, 4]}, [5, 6, 7], 4),
    (("A", 1), (9, 3, 5), {"A": [0, 1, 5], "B": [2], "C": [3, 4]}, [6, 7], 7),
    (("B", 2), (9, 5, 5), {"A": [0, 1, 5], "B": [2, 6], "C": [3, 4]}, [7], 9),
    (("B", "finishes"), (9, None, 5), {"A": [0, 1, 5], "C": [3, 4]}, [7, 2, 6], 6),
    (("C", 4), (9, None, 9), {"A": [0, 1, 5], "C": [3, 4, 7]}, [2, 6], 6),
]


def run_hand_worked(mode: str) -> BlockManager:
    """Replay the nine steps of the hand-worked example, checking every row of the table."""
    mgr = BlockManager(num_blocks=8, block_size=4)
    for step, (event, tokens, tables, free_list, wasted) in enumerate(HAND_WORKED):
        if event is not None:
            rid, what = event
            mgr.free(rid) if what == "finishes" else grow(mgr, rid, what, mode)
        assert tuple(mgr.lengths.get(r) for r in "ABC") == tokens, step
        assert mgr.tables == tables, step
        assert list(mgr.free_list) == free_list, step
        assert mgr.wasted_slots() == wasted, step
        mgr.check_invariants()
    return mgr


@pytest.mark.parametrize("mode", ["add", "append_tokens", "one-by-one"])
def test_hand_worked_example_all_nine_steps(mode):
    """Fails if blocks are taken from anywhere but the front, freed anywhere but the back, or too early/late."""
    run_hand_worked(mode)


def test_quiz_4_request_d_takes_the_last_two_free_blocks():
    """Fails if a 5-token prompt takes other than two blocks from the front, or position 4 maps wrongly."""
    mgr = run_hand_worked("add")
    mgr.add_request("D", 5)
    assert mgr.tables["D"] == [2, 6]
    assert list(mgr.free_list) == []
    assert mgr.num_free_blocks == 0
    assert mgr.blocks_for(5) * 4 - 5 == 3  # D's empty slots
    assert mgr.wasted_slots() == 6 + 3
    assert mgr.slot_of("D", 4) == (6, 0)


# -- prefix sharing and copy-on-write ----------------------------------------------------------

def test_prefix_sharing_run_copies_block_1_but_never_block_0():
    """Fails if fork copies or allocates, copy-on-write misses a shared block with room, or copies a private one."""
    mgr = BlockManager(num_blocks=6, block_size=4)
    refs = lambda: mgr.ref_count[:3]  # noqa: E731
    mgr.add_request("S1", 6)
    assert (mgr.tables, refs(), list(mgr.free_list)) == ({"S1": [0, 1]}, [1, 1, 0], [2, 3, 4, 5])
    mgr.fork("S1", "S2")
    assert (mgr.tables, refs(), list(mgr.free_list)) == (
        {"S1": [0, 1], "S2": [0, 1]}, [2, 2, 0], [2, 3, 4, 5])
    assert mgr.append("S1") == TokenWrite(block=2, offset=2, copy=(1, 2))
    assert (mgr.tables, refs(), list(mgr.free_list)) == (
        {"S1": [0, 2], "S2": [0, 1]}, [2, 1, 1], [3, 4, 5])
    assert mgr.append("S2") == TokenWrite(block=1, offset=2, copy=None)
    assert (mgr.tables, refs(), list(mgr.free_list)) == (
        {"S1": [0, 2], "S2": [0, 1]}, [2, 1, 1], [3, 4, 5])
    mgr.check_invariants()


def test_a_full_shared_block_is_never_written_or_copied():
    """Fails if a request appending after a full shared block copies it instead of taking a fresh block."""
    mgr = BlockManager(num_blocks=4, block_size=4)
    mgr.add_request("p", 8)
    mgr.fork("p", "c")
    assert mgr.append("c") == TokenWrite(block=2, offset=0, copy=None)
    assert mgr.tables == {"p": [0, 1], "c": [0, 1, 2]}
    assert mgr.ref_count == [2, 2, 1, 0]


def test_copy_on_write_that_cannot_get_a_block_changes_nothing():
    """Fails if a refused copy-on-write leaves a half-done copy, a changed ref count or a longer length."""
    mgr = BlockManager(num_blocks=2, block_size=4)
    mgr.add_request("S1", 6)
    mgr.fork("S1", "S2")
    before = snapshot(mgr)
    assert not mgr.can_append("S1")
    with pytest.raises(OutOfBlocks):
        mgr.append("S1")
    with pytest.raises(OutOfBlocks):
        mgr.append_tokens("S1", 1)
    assert snapshot(mgr) == before
    mgr.free("S2")  # now S1 owns block 1 alone and writes in place, no block needed
    assert mgr.append("S1") == TokenWrite(block=1, offset=2, copy=None)


def test_bulk_appends_are_all_or_nothing():
    """Fails if a prompt that does not fit takes some blocks anyway (a leak the scheduler cannot undo)."""
    mgr = BlockManager(num_blocks=3, block_size=4)
    mgr.add_request("a", 5)
    before = snapshot(mgr)
    assert not mgr.can_add_request(5)
    with pytest.raises(OutOfBlocks):
        mgr.add_request("b", 5)
    assert not mgr.can_append("a", 8)
    with pytest.raises(OutOfBlocks):
        mgr.append_tokens("a", 8)
    assert snapshot(mgr) == before
    assert mgr.can_append("a", 7)
    assert mgr.append_tokens("a", 7) is None
    assert mgr.tables["a"] == [0, 1, 2] and mgr.num_free_blocks == 0


def test_free_returns_a_shared_block_only_when_its_last_table_goes():
    """Fails if freeing one sharer hands a block still in use to another request."""
    mgr = BlockManager(num_blocks=4, block_size=2)
    mgr.add_request("p", 3)
    mgr.fork("p", "c")
    mgr.append("c")  # copy-on-write of block 1 into block 2
    mgr.free("p")
    assert list(mgr.free_list) == [3, 1]
    assert mgr.ref_count == [1, 0, 1, 0]
    mgr.free("c")
    assert list(mgr.free_list) == [3, 1, 0, 2]


def test_free_queue_removes_from_the_middle():
    """Fails if the O(1) removal that prefix caching will need breaks the queue's links or order."""
    q = FreeBlockQueue(5)
    q.remove(2)
    q.remove(0)
    q.append(2)
    assert list(q) == [1, 3, 4, 2] and len(q) == 4 and 0 not in q and 2 in q
    assert q.popleft() == 1
    with pytest.raises(ValueError):
        q.append(3)


# -- K/V data held outside the manager ----------------------------------------------------------

class KVStore:
    """A numpy K/V pool driven only by the slots and copies the manager reports."""

    def __init__(self, mgr: BlockManager, head_dim: int) -> None:
        self.mgr = mgr
        self.k = np.zeros((mgr.num_blocks, mgr.block_size, head_dim))
        self.v = np.zeros_like(self.k)

    def copy(self, copy) -> None:
        if copy is not None:
            src, dst = copy
            self.k[dst], self.v[dst] = self.k[src], self.v[src]

    def append(self, rid, k, v) -> None:
        write = self.mgr.append(rid)
        self.copy(write.copy)
        self.k[write.block, write.offset], self.v[write.block, write.offset] = k, v

    def append_tokens(self, rid, ks, vs) -> None:
        start = self.mgr.lengths[rid]
        self.copy(self.mgr.append_tokens(rid, len(ks)))
        for i, (k, v) in enumerate(zip(ks, vs)):
            block, offset = self.mgr.slot_of(rid, start + i)
            self.k[block, offset], self.v[block, offset] = k, v

    def gather(self, rid):
        slots = [self.mgr.slot_of(rid, p) for p in range(self.mgr.lengths[rid])]
        return np.array([self.k[s] for s in slots]), np.array([self.v[s] for s in slots])


def attention_contiguous(q, keys, values):
    scores = keys @ q / np.sqrt(len(q))
    weights = np.exp(scores - scores.max())
    return (weights / weights.sum()) @ values


def paged_attention(q, store: KVStore, rid):
    """The lesson's paged attention: walk the block table, reading the valid slots of each block."""
    n, size, table = store.mgr.lengths[rid], store.mgr.block_size, store.mgr.tables[rid]
    valid = [min(size, n - j * size) for j in range(len(table))]
    scores = np.concatenate([store.k[b, :m] @ q for b, m in zip(table, valid)]) / np.sqrt(len(q))
    weights = np.exp(scores - scores.max())
    weights /= weights.sum()
    out = np.zeros_like(q)
    for j, (block, m) in enumerate(zip(table, valid)):
        out += weights[j * size: j * size + m] @ store.v[block, :m]
    return out


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_reading_through_the_table_equals_reading_one_array(block_size):
    """Fails if a position maps to the wrong block or slot, a partial last block is misread, or a CoW copy is lost."""
    rng = np.random.default_rng(block_size)
    store = KVStore(BlockManager(num_blocks=64, block_size=block_size), head_dim=4)
    flat = {"x": ([], []), "y": ([], [])}
    kv = lambda n: (rng.standard_normal((n, 4)), rng.standard_normal((n, 4)))  # noqa: E731
    store.mgr.add_request("x")
    store.mgr.add_request("y")
    ks, vs = kv(3)
    store.append_tokens("y", ks, vs)  # a 3-token prompt in one call
    flat["y"][0].extend(ks), flat["y"][1].extend(vs)
    for i in range(13):
        for rid, n in (("x", 13), ("y", 7)):
            if i < n:
                (k,), (v,) = kv(1)
                store.append(rid, k, v)
                flat[rid][0].append(k), flat[rid][1].append(v)
        if i == 5:  # z shares x's first 6 tokens, then both diverge (copy-on-write unless B divides 6)
            store.mgr.fork("x", "z")
            flat["z"] = (list(flat["x"][0]), list(flat["x"][1]))
    for _ in range(4):
        (k,), (v,) = kv(1)
        store.append("z", k, v)
        flat["z"][0].append(k), flat["z"][1].append(v)
    x_table = store.mgr.tables["x"]
    if block_size < 16:  # the requests' blocks alternate in the pool, so the table matters
        assert x_table != list(range(x_table[0], x_table[0] + len(x_table)))
    q = rng.standard_normal(4)
    for rid, (keys, values) in flat.items():
        keys, values = np.array(keys), np.array(values)
        got_k, got_v = store.gather(rid)
        assert np.array_equal(got_k, keys) and np.array_equal(got_v, values), rid
        assert np.allclose(paged_attention(q, store, rid), attention_contiguous(q, keys, values))
    store.mgr.check_invariants()


# -- randomized invariants ----------------------------------------------------------------------

class Harness:
    """Drives a BlockManager with random ops, mirroring every written token in a numpy store."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.mgr = BlockManager(rng.randint(4, 24), rng.choice([1, 2, 3, 4, 8]))
        self.pool = np.full((self.mgr.num_blocks, self.mgr.block_size), -1, dtype=np.int64)
        self.expected: dict[int, list[int]] = {}
        self.next_value = self.next_rid = 0

    def _values(self, n: int) -> list[int]:
        self.next_value += n
        return list(range(self.next_value - n, self.next_value))

    def _write(self, rid, copy, values) -> None:
        if copy is not None:
            self.pool[copy[1]] = self.pool[copy[0]]
        start = len(self.expected[rid])
        for i, value in enumerate(values):
            self.pool[self.mgr.slot_of(rid, start + i)] = value
        self.expected[rid].extend(values)

    def step(self) -> None:
        """One random op; a refused op must have been predicted by can_* and change nothing."""
        mgr, rng, live = self.mgr, self.rng, list(self.expected)
        op = rng.choices(["add", "append", "bulk", "fork", "free"], [2, 6, 2, 1, 2])[0]
        if op in ("append", "bulk", "fork", "free") and not live:
            op = "add"
        rid = rng.choice(live) if op != "add" else None
        n = {"add": rng.randint(0, 3 * mgr.block_size), "append": 1,
             "bulk": rng.randint(0, 2 * mgr.block_size)}.get(op, 0)
        before = snapshot(mgr)
        predicted = {"add": lambda: mgr.can_add_request(n),
                     "append": lambda: mgr.can_append(rid, 1),
                     "bulk": lambda: mgr.can_append(rid, n)}.get(op, lambda: True)()
        try:
            self._apply(op, rid, n)
        except OutOfBlocks:
            assert not predicted and snapshot(mgr) == before
        else:
            assert predicted

    def _apply(self, op: str, rid, n: int) -> None:
        mgr = self.mgr
        if op == "add":
            rid, self.next_rid = self.next_rid, self.next_rid + 1
            mgr.add_request(rid, n)
            self.expected[rid] = []
            self._write(rid, None, self._values(n))
        elif op == "append":
            write = mgr.append(rid)
            assert (write.block, write.offset) == mgr.slot_of(rid, mgr.lengths[rid] - 1)
            self._write_one(rid, write)
        elif op == "bulk":
            values = self._values(n)
            self._write(rid, mgr.append_tokens(rid, n), values)
        elif op == "fork":
            child, self.next_rid = self.next_rid, self.next_rid + 1
            mgr.fork(rid, child)
            self.expected[child] = list(self.expected[rid])
        else:
            mgr.free(rid)
            del self.expected[rid]

    def _write_one(self, rid, write: TokenWrite) -> None:
        if write.copy is not None:
            self.pool[write.copy[1]] = self.pool[write.copy[0]]
        (value,) = self._values(1)
        self.pool[write.block, write.offset] = value
        self.expected[rid].append(value)

    def check(self) -> None:
        """Structural invariants, plus every request reads back exactly what it wrote."""
        self.mgr.check_invariants()
        flat, size = self.pool.reshape(-1), self.mgr.block_size
        offsets = np.arange(size)
        for rid, values in self.expected.items():
            table = np.asarray(self.mgr.tables[rid], dtype=np.int64)
            slots = (table[:, None] * size + offsets).reshape(-1)[: len(values)]
            assert self.mgr.lengths[rid] == len(values)
            assert flat[slots].tolist() == values, rid


@pytest.mark.parametrize("seed", range(50))
def test_random_ops_keep_every_invariant(seed):
    """Fails if any mix of add/append/append_tokens/fork/free loses, double-books or mis-counts a block, or corrupts data."""
    harness = Harness(random.Random(seed))
    for _ in range(2000):
        harness.step()
        harness.check()
