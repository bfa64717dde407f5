"""ContiguousPool and the reservation policies: the lesson's Figure 2, first fit, coalescing."""

from __future__ import annotations

import random

import pytest

from kvplan.errors import KvplanError
from kvplan.memory.contiguous import ContiguousPool, reservation


def figure_2_pool() -> ContiguousPool:
    """The lesson's Figure 2(a): R1 reserves 12 holds 5, R2 reserves 8 holds 3, R3 reserves 8 holds 6."""
    pool = ContiguousPool(32)
    for rid, reserve, held in (("R1", 12, 5), ("R2", 8, 3), ("R3", 8, 6)):
        assert pool.allocate(rid, reserve) is not None
        pool.set_tokens(rid, held)
    return pool


def test_figure_2a_three_buffers_hold_14_empty_reserved_slots():
    """Fails if first fit misplaces buffers or the internal-fragmentation count is wrong."""
    pool = figure_2_pool()
    assert {rid: (b.start, b.reserved) for rid, b in pool.buffers.items()} == {
        "R1": (0, 12), "R2": (12, 8), "R3": (20, 8)}
    assert pool.reserved_empty_slots == 14
    assert pool.num_tokens == 14
    assert pool.free_runs() == [(28, 4)]
    pool.check_invariants()


def test_figure_2b_twelve_free_slots_in_runs_of_8_and_4_refuse_a_request_of_12():
    """Fails if freeing loses the gap, or a request is placed across two runs, or a refusal changes state."""
    pool = figure_2_pool()
    pool.free("R2")
    assert pool.num_free_slots == 12
    assert pool.free_runs() == [(12, 8), (28, 4)]
    assert pool.largest_free_run() == 8
    before = (pool.free_runs(), dict(pool.buffers), dict(pool.lengths), pool.num_free_slots)
    assert not pool.can_allocate(12)
    assert pool.allocate("R4", 12) is None
    assert (pool.free_runs(), dict(pool.buffers), dict(pool.lengths), pool.num_free_slots) == before
    assert "R4" not in pool.buffers
    pool.check_invariants()


def test_first_fit_takes_the_lowest_run_long_enough():
    """Fails if placement is best fit or last fit instead of first fit over runs sorted by start."""
    pool = figure_2_pool()
    pool.free("R2")  # runs (12, 8), (28, 4)
    assert pool.allocate("small", 3) == 12  # first run, though (28, 4) fits more tightly
    assert pool.allocate("four", 5) == 15
    assert pool.allocate("tail", 4) == 28
    assert pool.free_runs() == []


def test_freeing_coalesces_with_both_neighbours():
    """Fails if adjacent free runs are not merged, which would refuse requests that fit."""
    pool = ContiguousPool(30)
    for rid in "abc":
        pool.allocate(rid, 10)
    pool.free("a")
    pool.free("c")
    assert pool.free_runs() == [(0, 10), (20, 10)]
    pool.free("b")
    assert pool.free_runs() == [(0, 30)]
    assert pool.allocate("whole", 30) == 0


def test_a_buffer_cannot_grow_past_its_reservation():
    """Fails if append lets a request write outside its own run, into a neighbour's slots."""
    pool = ContiguousPool(16)
    pool.allocate("r", 4)
    pool.append("r", 3)
    pool.append("r")
    with pytest.raises(ValueError):
        pool.append("r")
    assert pool.lengths["r"] == 4
    assert pool.slot_of("r", 3) == 3
    with pytest.raises(IndexError):
        pool.slot_of("r", 4)


@pytest.mark.parametrize("policy, final_len, limit, expected", [
    ("max", 200, 8192, 8192),
    ("max", 8192, 8192, 8192),
    ("pow2", 1, 8192, 1),
    ("pow2", 2, 8192, 2),
    ("pow2", 3, 8192, 4),
    ("pow2", 1024, 8192, 1024),
    ("pow2", 1025, 8192, 2048),
    ("pow2", 5000, 6000, 6000),  # next power of two (8192) capped at the limit
    ("oracle", 777, 8192, 777),
])
def test_reservation_policies(policy, final_len, limit, expected):
    """Fails if a policy reserves other than Kwon et al.'s baselines: the limit, next power of two, exact."""
    assert reservation(policy, final_len, limit) == expected


@pytest.mark.parametrize("policy, final_len, limit, field", [
    ("max", 9000, 8192, "contiguous_max_len"),
    ("oracle", 0, 8192, "contiguous_max_len"),
    ("pow2", 10, 0, "contiguous_max_len"),
    ("best", 10, 8192, "policy"),
])
def test_reservation_rejects_impossible_requests(policy, final_len, limit, field):
    """Fails if a request that no contiguous buffer could serve is silently given one, or the error hides the field."""
    with pytest.raises(KvplanError) as err:
        reservation(policy, final_len, limit)
    assert err.value.field == field


def test_random_allocate_and_free_keep_every_slot_accounted():
    """Fails if any mix of allocations and frees loses, double-books or mis-coalesces a slot."""
    for seed in range(20):
        rng = random.Random(seed)
        pool, live, next_id = ContiguousPool(64), [], 0
        for _ in range(300):
            if live and rng.random() < 0.45:
                pool.free(live.pop(rng.randrange(len(live))))
            else:
                reserve = rng.randint(1, 20)
                fits = reserve <= pool.largest_free_run()
                start = pool.allocate(next_id, reserve)
                assert (start is not None) == fits
                if start is not None:
                    pool.set_tokens(next_id, rng.randint(0, reserve))
                    live.append(next_id)
                next_id += 1
            pool.check_invariants()
