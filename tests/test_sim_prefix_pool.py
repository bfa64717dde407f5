"""The fast engine's prefix cache (kvplan/sim/kernel.py's flat arrays) against memory/'s BlockPool.

The step-by-step reference runs on kvplan/memory/prefix_cache.py's BlockPool; here the kernel is
run one event at a time (a step, a jump over decode steps, or an idle gap) and the reference up to
the same step and tick, and after every event the two pools must be the same: the free queue in
order (cached blocks by key, the anonymous ones between them counted), every cached copy of every
key with its holders, the blocks each running request holds and which copies, blocks shared,
free blocks and the counters. Random workloads with shared prefixes in pools small enough to
evict and preempt, drawn by Hypothesis (which shrinks a failure to a short one) and by seed.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.sim import kernel as K
from kvplan.sim.engine import KernelState
from kvplan.sim.inputs import prepared_chunks
from kvplan.sim.metrics import build_result
from kvplan.sim.reference import reference_sim
from kvplan.workload.records import (AllocatorSpec, PoolSpec, RequestChunk, SchedulerConfig,
                                     TimingConfig, Workload)
from tests.test_sim_engine import as_json
from tests.test_sim_prefix_serve import random_prefix_workload

COUNTERS = {"lookups": K.PC_LOOKUPS, "query_tokens": K.PC_QUERY_TOKENS, "hit_tokens": K.PC_HIT_TOKENS,
            "prefill_tokens_saved": K.PC_PREFILL_SAVED, "blocks_evicted": K.PC_BLOCKS_EVICTED,
            "blocks_reused": K.PC_BLOCKS_REUSED}


def entry(state, e: int, field: int) -> int:
    return int(state.ents[e * K.NE + field])


def kernel_queue(state) -> tuple[list[tuple[int, int]], int]:
    """The kernel's free queue: (anonymous blocks in front, block node) per cached entry, front
    first, and the anonymous blocks behind the last."""
    out, e = [], int(state.st[K.Q_HEAD])
    while e >= 0:
        out.append((entry(state, e, K.E_ANON), entry(state, e, K.E_NODE)))
        e = entry(state, e, K.E_NEXT)
    return out, int(state.st[K.ANON_TAIL])


def pool_queue(pool) -> tuple[list[tuple[int, int]], int]:
    """The same of a BlockPool, read from its physical blocks."""
    out, anon = [], 0
    for block in pool.free_list:
        key = pool.block_hash.get(block)
        if key is None:
            anon += 1
        else:
            out.append((anon, key))
            anon = 0
    return out, anon


def kernel_copies(state) -> dict[int, list[int]]:
    """Block node -> the holders of each of its cached copies, oldest first; and each entry's place
    in its node's copies."""
    copies, place = {}, {}
    for node in np.flatnonzero(state.copies >= 0).tolist():
        e, refs = int(state.copies[node]), []
        while e >= 0:
            place[e] = len(refs)
            refs.append(entry(state, e, K.E_REF))
            e = entry(state, e, K.E_COPY)
        copies[node] = refs
    return copies, place


def assert_pools_agree(state, sim) -> None:
    """Everything the kernel's pool exposes equals the reference's BlockPool after an event."""
    st, pool, b = state.st, sim.blocks, sim.s.block_size
    pool.check_invariants()
    assert (int(st[K.STEPS]), int(st[K.NOW])) == (sim.steps, sim.t)
    assert kernel_queue(state) == pool_queue(pool)
    assert int(st[K.FREE_BLOCKS]) == pool.num_free_blocks
    copies, place = kernel_copies(state)
    assert copies == {key: [int(pool.ref_count[blk]) for blk in blocks]
                      for key, blocks in pool.cached_block_hash_to_block.items()}
    assert {name: int(st[i]) for name, i in COUNTERS.items()} == {
        name: getattr(pool.stats(), name) for name in COUNTERS}
    held = pool.ref_count[list(pool.block_hash)] if pool.block_hash else np.zeros(0, dtype=np.int64)
    assert int(st[K.SHARED]) == int(np.maximum(held - 1, 0).sum()) == sim.shared_slots() // b
    running = state.running[:int(st[K.NUM_RUNNING])].tolist()
    assert running == [r.rid for r in sim.running]
    req = state.req
    for r in sim.running:
        row = (int(req[r.rid, K.HELD]), int(req[r.rid, K.BLOCKS]), int(req[r.rid, K.CACHED]),
               int(req[r.rid, K.HIT_TOKENS]), int(req[r.rid, K.PREFILL_END]))
        assert row == (r.held, r.blocks, r.cached, r.hit_tokens, r.target), r.rid
        start = int(req[r.rid, K.E_START])
        mine = [place[int(e)] for e in state.held[start:start + r.cached]]
        assert mine == [list(pool.cached_block_hash_to_block[r.nodes[j]]).index(blk)
                        for j, blk in enumerate(r.table[:r.cached])], r.rid


def run_in_lockstep(wl, spec) -> dict[str, int]:
    """Run the kernel event by event beside the reference, comparing the pools after each; then
    the whole results. Returns what the run exercised."""
    sim, clipped, delayed = reference_sim(wl, spec)
    setup = sim.s
    state = KernelState(setup)
    for chunk in prepared_chunks(wl, setup):
        state.load(chunk)
    seen = {"events": 0, "copies": 0, "in_use_peak": 0}
    if state.loaded:
        state.st[K.ALL_LOADED] = 1
        while True:
            code = K.run(*state.kernel_args(), 1)
            while sim.steps < state.st[K.STEPS] or sim.t < state.st[K.NOW]:
                assert sim.advance()
            if code == 0:
                break
            assert code == 2
            assert_pools_agree(state, sim)
            seen["events"] += 1
            seen["copies"] = max(seen["copies"], max(map(len, sim.blocks.cached_block_hash_to_block.values()),
                                                     default=0))
            seen["in_use_peak"] = max(seen["in_use_peak"], setup.num_blocks - sim.blocks.num_free_blocks)
        assert not sim.advance()
        assert_pools_agree(state, sim)
    fast = build_result(state.raw(), setup, record_requests=True)
    raw = sim.raw(clipped)
    if delayed:  # the API server delays requests: latencies count from the client's send
        raw = replace(raw, sent=np.array([r.sent for r in sim.reqs], dtype=np.int64))
    slow = build_result(raw, setup, record_requests=True)
    assert as_json(fast) == as_json(slow)
    stats = sim.blocks.stats()
    seen.update(evicted=stats.blocks_evicted, reused=stats.blocks_reused, hits=stats.hit_tokens,
                preemptions=sim.preemptions, readmit_hits=stats.prefill_tokens_saved - stats.hit_tokens)
    return seen


@st.composite
def shared_prefix_workloads(draw):
    """A small serve workload whose prompts follow a few families of hash-id chains (ids from a
    small alphabet, so families share heads too) for a random depth, then ids of their own; a
    pool of one to a few max_model_len requests, so that blocks are evicted and requests
    preempted."""
    b = draw(st.sampled_from([1, 2, 4, 8]))
    hash_block = b * draw(st.sampled_from([1, 2, 4]))
    mml = hash_block * 10 + draw(st.integers(1, 19))
    families = draw(st.lists(st.lists(st.integers(0, 3), min_size=8, max_size=8), min_size=1, max_size=3))
    rows = draw(st.lists(st.tuples(st.integers(0, len(families) - 1), st.integers(0, 8), st.integers(0, 2),
                                   st.integers(0, hash_block), st.integers(0, 20),
                                   st.sampled_from([0.0, 0.0, 0.5, 2.0, 6.0])),
                         min_size=1, max_size=30))
    prompts, outputs, ids, gaps, fresh = [], [], [], [], 1 << 40
    for family, depth, own, extra, output, gap in rows:
        chain = families[family][:depth] + list(range(fresh, fresh + own))
        fresh += own
        prompts.append(max(1, min(len(chain) * hash_block + extra, mml - 1)))
        outputs.append(min(output, mml - prompts[-1]))
        ids.append(tuple(chain))
        gaps.append(gap)
    chunked = draw(st.booleans())
    budget = draw(st.integers(1, 2 * mml) if chunked else st.integers(mml, 2 * mml))
    null = draw(st.booleans())
    sched = SchedulerConfig(draw(st.integers(1, 8)), budget, mml, chunked, "recompute", 0, null, True)
    slots = draw(st.integers(-(-mml // b) * b, 3 * mml + b)) + (b if null else 0)
    arrival = np.cumsum(gaps)
    timing = TimingConfig()
    if draw(st.booleans()):  # steps of modelled length: arrivals fall inside steps and jumps
        arrival = arrival * 1e-6
        timing = TimingConfig("test-gpu", 1e12, 1e12, draw(st.integers(0, 300_000)),
                              float(draw(st.integers(0, 50_000))), draw(st.integers(0, 20_000)),
                              1.0, 1.0, 0.0)
    n = len(rows)
    size = draw(st.integers(1, n))

    def make():
        p, o = np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64)
        for s in range(0, n, size):
            yield RequestChunk(arrival[s:s + size], p[s:s + size], o[s:s + size], ids[s:s + size],
                               hash_block)

    spec = AllocatorSpec("paged", block_size=b)
    return Workload("shared-prefixes", "", 0, "serve", n, PoolSpec(slots), (spec,), sched, timing, make), spec


@settings(max_examples=150)
@given(shared_prefix_workloads())
def test_kernel_pool_equals_the_block_pool_event_by_event(case):
    """Fails if the kernel's free queue order, cached copies, holders, shared blocks, hits,
    evictions or reuses ever differ from memory's BlockPool under the reference's scheduler."""
    run_in_lockstep(*case)


def test_kernel_pool_equals_the_block_pool_on_the_seeded_workloads():
    """The same on the prefix engine tests' random workloads (larger ones too), which together
    evict, preempt, re-admit with hits, revive free cached blocks and hold copies of one key."""
    total: dict[str, int] = {}
    for seed in range(60):
        seen = run_in_lockstep(*random_prefix_workload(seed, big=seed % 4 == 3)[:2])
        for key, value in seen.items():
            total[key] = total.get(key, 0) + (value > 1 if key == "copies" else value > 0)
    assert min(total.values()) >= 5, total
