"""BlockManager under Hypothesis's stateful testing: shrinking finds the shortest op sequence that breaks it."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, multiple, rule

from kvplan.memory.paged import BlockManager, OutOfBlocks


class BlockManagerMachine(RuleBasedStateMachine):
    """Random add/append/append_tokens/fork/free against a model of what each request wrote.

    Each written token gets a unique integer, stored in a numpy pool at the slot the manager
    reports (copying a block when it reports copy-on-write); every request must read its own
    integers back through its block table after every step.
    """

    requests = Bundle("requests")

    @initialize(num_blocks=st.integers(1, 12), block_size=st.sampled_from([1, 2, 3, 4]))
    def start(self, num_blocks, block_size):
        self.mgr = BlockManager(num_blocks, block_size)
        self.pool = np.full((num_blocks, block_size), -1, dtype=np.int64)
        self.expected: dict[int, list[int]] = {}
        self.next_id = 0
        self.values = itertools.count()  # a fresh value per written token

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _state(self):
        m = self.mgr
        return ({r: list(t) for r, t in m.tables.items()}, dict(m.lengths), list(m.ref_count),
                list(m.free_list))

    def _store(self, rid, copy, n: int) -> None:
        """Apply a reported block copy, then write n fresh values at the request's new positions."""
        if copy is not None:
            self.pool[copy[1]] = self.pool[copy[0]]
        start = len(self.expected[rid])
        for pos in range(start, start + n):
            value = next(self.values)
            self.pool[self.mgr.slot_of(rid, pos)] = value
            self.expected[rid].append(value)

    def _try(self, call):
        """Run call; on OutOfBlocks check that nothing changed. Returns (refused, call's result)."""
        before = self._state()
        try:
            return False, call()
        except OutOfBlocks:
            assert self._state() == before
            return True, None

    @rule(target=requests, n=st.integers(0, 9))
    def add(self, n):
        rid, fits = self._new_id(), self.mgr.can_add_request(n)
        refused, _ = self._try(lambda: self.mgr.add_request(rid, n))
        assert refused != fits
        if refused:
            return multiple()
        self.expected[rid] = []
        self._store(rid, None, n)
        return rid

    @rule(rid=requests)
    def append(self, rid):
        fits = self.mgr.can_append(rid)
        refused, write = self._try(lambda: self.mgr.append(rid))
        assert refused != fits
        if refused:
            return
        assert (write.block, write.offset) == self.mgr.slot_of(rid, self.mgr.lengths[rid] - 1)
        if write.copy is not None:
            self.pool[write.copy[1]] = self.pool[write.copy[0]]
        value = next(self.values)
        self.pool[write.block, write.offset] = value
        self.expected[rid].append(value)

    @rule(rid=requests, n=st.integers(0, 9))
    def append_tokens(self, rid, n):
        fits = self.mgr.can_append(rid, n)
        refused, copy = self._try(lambda: self.mgr.append_tokens(rid, n))
        assert refused != fits
        if not refused:
            self._store(rid, copy, n)

    @rule(target=requests, parent=requests)
    def fork(self, parent):
        child = self._new_id()
        self.mgr.fork(parent, child)
        self.expected[child] = list(self.expected[parent])
        return child

    @rule(rid=consumes(requests))
    def free(self, rid):
        self.mgr.free(rid)
        del self.expected[rid]

    @invariant()
    def bookkeeping_is_consistent(self):
        self.mgr.check_invariants()

    @invariant()
    def every_request_reads_back_what_it_wrote(self):
        for rid, values in self.expected.items():
            table, size = self.mgr.tables[rid], self.mgr.block_size  # position p: table[p // B], p % B
            got = [int(self.pool[table[p // size], p % size]) for p in range(self.mgr.lengths[rid])]
            assert got == values, rid


BlockManagerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_block_manager_state_machine = BlockManagerMachine.TestCase
test_block_manager_state_machine.__doc__ = (
    "Fails if some sequence of ops breaks a bookkeeping invariant or returns another request's data.")
