"""The closed-form static capacity experiment: the lesson's figures and agreement with the object models."""

from __future__ import annotations

import numpy as np
import pytest

from kvplan.errors import KvplanError
from kvplan.memory.capacity import (
    BLOCK_SIZES,
    capacity_sweep,
    contiguous_capacity,
    contiguous_reservations,
    paged_capacity,
    paged_capacity_sweep,
)
from kvplan.memory.contiguous import POLICIES, ContiguousPool, reservation
from kvplan.memory.paged import BlockManager, OutOfBlocks

LESSON_POOL = 131_072  # 16 GiB of Llama 3 8B KV cache at 128 KiB per token


def lesson_lengths() -> np.ndarray:
    return np.random.default_rng(0).integers(100, 2001, 500)


def test_lesson_contiguous_max_admits_16_using_12_9_percent():
    """Fails if the contiguous baseline's admission or utilization drifts from the lesson's printed figures."""
    r = contiguous_capacity(lesson_lengths(), LESSON_POOL, "max", 8192)
    assert r.admitted == 16
    assert r.allocated_slots == 16 * 8192
    assert round(r.utilization, 3) == 0.129


def test_lesson_paged_b16_admits_122_wasting_913_of_130800():
    """Fails if the paged closed form's admission, block rounding or waste drifts from the lesson's figures."""
    contiguous = contiguous_capacity(lesson_lengths(), LESSON_POOL, "max", 8192)
    r = paged_capacity(lesson_lengths(), LESSON_POOL, 16)
    assert r.admitted == 122
    assert round(r.admitted / contiguous.admitted, 1) == 7.6
    assert (r.wasted_slots, r.allocated_slots) == (913, 130_800)
    assert round(100 * r.wasted_slots / r.allocated_slots, 1) == 0.7


def drive_contiguous(lengths, slots: int, policy: str, limit: int):
    """The static experiment run on ContiguousPool, one request at a time."""
    pool = ContiguousPool(slots)
    for i, n in enumerate(lengths.tolist()):
        if pool.allocate(i, reservation(policy, n, limit)) is None:
            break
        pool.set_tokens(i, n)
    pool.check_invariants()
    return len(pool.buffers), pool.num_reserved_slots, pool.num_tokens, pool.num_free_slots


def drive_paged(lengths, slots: int, block_size: int):
    """The static experiment run on BlockManager, one request at a time, the prompt in one call."""
    mgr = BlockManager(slots // block_size, block_size)
    for i, n in enumerate(lengths.tolist()):
        try:
            mgr.add_request(i, n)
        except OutOfBlocks:
            break
    mgr.check_invariants()
    allocated = mgr.num_used_blocks * block_size
    return len(mgr.tables), allocated, mgr.num_stored_tokens, mgr.wasted_slots(), mgr.num_free_blocks


@pytest.mark.parametrize("seed", range(8))
def test_closed_form_matches_the_object_models(seed):
    """Fails if the vectorized prefix sums disagree with ContiguousPool and BlockManager on admission or waste."""
    rng = np.random.default_rng(seed)
    limit = int(rng.integers(8, 65))
    lengths = rng.integers(1, limit + 1, int(rng.integers(0, 60)))
    slots = int(rng.integers(0, 600))
    for policy in POLICIES:
        r = contiguous_capacity(lengths, slots, policy, limit)
        admitted, reserved, tokens, free = drive_contiguous(lengths, slots, policy, limit)
        assert (r.admitted, r.allocated_slots, r.tokens_stored) == (admitted, reserved, tokens)
        assert (r.wasted_slots, r.breakdown.free) == (reserved - tokens, free)
    for r, b in zip(paged_capacity_sweep(lengths, slots, (1, 2, 3, 4, 8, 16, 64)), (1, 2, 3, 4, 8, 16, 64)):
        admitted, allocated, tokens, wasted, free_blocks = drive_paged(lengths, slots, b)
        assert (r.admitted, r.allocated_slots, r.tokens_stored) == (admitted, allocated, tokens)
        assert (r.wasted_slots, r.breakdown.free) == (wasted, free_blocks * b)


@pytest.mark.parametrize("seed", range(4))
def test_breakdown_partitions_the_pool(seed):
    """Fails if a slot is counted in two categories or in none (the five must sum to the pool)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 3000, 2000)
    slots = int(rng.integers(10_000, 500_000))  # rarely a multiple of the block size
    for r in capacity_sweep(lengths, slots, limit=4096, block_sizes=(1, 3, 16, 64, 100)):
        d = r.breakdown
        assert d.total == slots, r.allocator
        assert d.token_states == r.tokens_stored and d.reserved == 0
        assert d.internal_fragmentation == r.wasted_slots == r.allocated_slots - r.tokens_stored
        assert min(d.token_states, d.internal_fragmentation, d.external_fragmentation, d.free) >= 0
    paged = paged_capacity(lengths, slots, 100)
    assert paged.breakdown.external_fragmentation == slots % 100


def test_paged_internal_fragmentation_stays_below_one_block_per_request():
    """Fails if paged rounding wastes a whole block or more on some request (the lesson's bound)."""
    lengths = np.random.default_rng(3).integers(1, 5000, 10_000)
    for r, b in zip(paged_capacity_sweep(lengths, 10**9, BLOCK_SIZES), BLOCK_SIZES):
        assert r.admitted == len(lengths)
        assert r.breakdown.internal_fragmentation == int(((-lengths) % b).sum())


def test_vectorized_reservations_match_the_scalar_policy():
    """Fails if the numpy reservation (pow2 bit tricks especially) disagrees with reservation() anywhere."""
    lengths = np.arange(1, 3001)
    for limit in (1, 7, 1024, 1500, 3000):
        ok = lengths[lengths <= limit]
        for policy in POLICIES:
            expected = [reservation(policy, int(n), limit) for n in ok]
            assert contiguous_reservations(ok, policy, limit).tolist() == expected, (policy, limit)


def test_sweep_equals_separate_runs_and_keeps_order():
    """Fails if the shared work of a sweep leaks between block sizes or the results come back out of order."""
    lengths = lesson_lengths()
    swept = capacity_sweep(lengths, LESSON_POOL, limit=8192)
    separate = [contiguous_capacity(lengths, LESSON_POOL, p, 8192) for p in POLICIES]
    separate += [paged_capacity(lengths, LESSON_POOL, b) for b in BLOCK_SIZES]
    assert swept == separate
    assert [r.allocator for r in swept][:4] == [
        "contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged-B1"]


def test_an_empty_stream_or_a_too_long_first_request_admits_nothing():
    """Fails if a refusal of the very first request or an empty stream yields NaN or negative counts."""
    empty = paged_capacity(np.array([], dtype=np.int64), 64, 16)
    assert (empty.admitted, empty.utilization, empty.breakdown.free) == (0, 0.0, 64)
    huge = contiguous_capacity(np.array([5000, 1]), 4096, "oracle", 8192)
    assert (huge.admitted, huge.allocated_slots, huge.utilization) == (0, 0, 0.0)


@pytest.mark.parametrize("call, field", [
    (lambda: contiguous_capacity(np.array([100, 9000]), 10**6, "max", 8192), "contiguous_max_len"),
    (lambda: contiguous_capacity(np.array([100, 9000]), 10**6, "oracle", 8192), "contiguous_max_len"),
    (lambda: contiguous_capacity(np.array([100]), 10**6, "best", 8192), "policy"),
    (lambda: paged_capacity(np.array([100, 0]), 10**6, 16), "lengths"),
    (lambda: paged_capacity(np.array([1.5, 2.0]), 10**6, 16), "lengths"),
    (lambda: paged_capacity(np.array([[1, 2]]), 10**6, 16), "lengths"),
    (lambda: paged_capacity(np.array([100]), 10**6, 0), "block_size"),
    (lambda: paged_capacity(np.array([100]), -1, 16), "slots"),
])
def test_bad_inputs_name_their_field(call, field):
    """Fails if an impossible workload is clipped or computed silently, or the error does not say which field."""
    with pytest.raises(KvplanError) as err:
        call()
    assert err.value.field == field
