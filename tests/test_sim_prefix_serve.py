"""Automatic prefix caching inside the serve engines: the fast engine against the block-by-block
reference on random workloads with shared prefixes, conservation, and hand-checked cases."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvplan.sim import kernel as K
from kvplan.sim.engine import KernelState, simulate
from kvplan.sim.inputs import make_setup, prepared_chunks
from kvplan.sim.reference import simulate_reference
from kvplan.workload.records import (AllocatorSpec, PoolSpec, RequestChunk, SchedulerConfig,
                                     TimingConfig, Workload)
from tests.test_sim_engine import as_json, random_step_model


def shared_prompts(rng, n: int, hash_block: int, mml: int):
    """Prompt lengths and hash ids: a few families of prefixes, each request following one for a
    random depth, then its own ids; some prompts end in a partial hash block."""
    families = [rng.integers(0, 1 << 30, size=8).tolist() for _ in range(int(rng.integers(1, 4)))]
    prompts, ids = [], []
    fresh = 1 << 40
    for _ in range(n):
        depth = int(rng.integers(0, 9))
        own = int(rng.integers(0, 3))
        chain = families[int(rng.integers(len(families)))][:depth] + list(range(fresh, fresh + own))
        fresh += own
        length = len(chain) * hash_block + int(rng.integers(0, hash_block + 1))
        length = max(1, min(length, mml - 1))
        prompts.append(length)
        ids.append(tuple(chain))
    return np.asarray(prompts, dtype=np.int64), ids


def random_prefix_workload(seed: int, big: bool = False):
    rng = np.random.default_rng([seed, 77, int(big)])
    b = int(rng.choice([1, 2, 4, 8]))
    hash_block = b * int(rng.choice([1, 2, 4]))
    mml = hash_block * 10 + int(rng.integers(1, 20))
    n = int(rng.integers(40, 200) if big else rng.integers(2, 40))
    prompt, ids = shared_prompts(rng, n, hash_block, mml)
    output = np.minimum(rng.integers(0, 60 if big else 20, n), mml - prompt)
    arrival = np.cumsum(rng.exponential(rng.choice([0.3, 2, 10]), n))
    if rng.random() < 0.2:
        arrival[:] = 0.0
    timed = bool(rng.random() < 0.5)
    if timed:
        arrival *= float(rng.choice([1e-7, 1e-5]))
    chunked = bool(rng.random() < 0.7)
    budget = int(rng.integers(1, 2 * mml)) if chunked else int(rng.integers(mml, 2 * mml + 1))
    null = bool(rng.random() < 0.5)
    sched = SchedulerConfig(int(rng.integers(1, 24 if big else 8)), budget, mml, chunked, "recompute",
                            0, null, True)
    slots = int(rng.integers(-(-mml // b) * b, 3 * mml + b + 1)) + (b if null else 0)
    timing = TimingConfig()
    if timed:
        timing = TimingConfig("test-gpu", 1e12, 1e12, int(rng.integers(0, 300_000)),
                              float(rng.integers(0, 50_000)), int(rng.integers(0, 20_000)),
                              1.0, 1.0, float(rng.integers(0, 3)) * 1e-8)
        if rng.random() < 0.5:
            timing = replace(timing, step=random_step_model(rng))
    size = int(rng.integers(1, n + 1))

    def make():
        for s in range(0, n, size):
            yield RequestChunk(arrival[s:s + size], prompt[s:s + size], output[s:s + size],
                               ids[s:s + size], hash_block)

    spec = AllocatorSpec("paged", block_size=b)
    wl = Workload("random-prefix", "", seed, "serve", n, PoolSpec(slots), (spec,), sched, timing, make)
    return wl, spec, int(rng.choice([4, 8, 64, 2048]))


@pytest.mark.parametrize("seed", range(300))
def test_engine_equals_reference_with_prefix_caching(seed):
    """Breaks if a hit, an eviction, the free queue's order or a jump differs from the plain
    block-by-block pool."""
    wl, spec, points = random_prefix_workload(seed)
    fast = simulate(wl, spec, record_requests=True, timeline_points=points)
    slow = simulate_reference(wl, spec, record_requests=True, timeline_points=points)
    assert as_json(fast) == as_json(slow)


@pytest.mark.parametrize("seed", range(30))
def test_engine_equals_reference_with_prefix_caching_larger(seed):
    wl, spec, points = random_prefix_workload(seed, big=True)
    fast = simulate(wl, spec, record_requests=True, timeline_points=points)
    slow = simulate_reference(wl, spec, record_requests=True, timeline_points=points)
    assert as_json(fast) == as_json(slow)


def test_random_workloads_do_hit_evict_and_preempt():
    """The random cases above exercise what they are meant to (else they would prove little)."""
    hits = evicted = preempted = shared = 0
    for seed in range(60):
        wl, spec, _ = random_prefix_workload(seed, big=seed % 2 == 1)
        d = simulate(wl, spec).to_dict()
        hits += d["prefix_cache"]["hit_tokens"] > 0
        evicted += d["prefix_cache"]["blocks_evicted"] > 0
        preempted += d["preemptions"] > 0
        shared += d["prefix_cache"]["blocks_reused"] > 0
    assert min(hits, evicted, preempted, shared) >= 10


@pytest.mark.parametrize("seed", range(40))
def test_prefix_cache_conservation(seed):
    """Every block comes back; every cached entry left is free and in the queue; the queue's
    anonymous and cached blocks add up to the free count."""
    wl, spec, _ = random_prefix_workload(seed, big=seed % 2 == 1)
    setup = make_setup(wl, spec)
    state = KernelState(setup)
    for chunk in prepared_chunks(wl, setup):
        state.load(chunk)
        state.run(final=False)
    state.run(final=True)
    st, ent = state.st, state.ents
    assert st[K.FREE_BLOCKS] == setup.num_blocks and st[K.SHARED] == 0
    queued, anon, e = 0, int(st[K.ANON_TAIL]), int(st[K.Q_HEAD])
    while e >= 0:
        assert ent[e * K.NE + K.E_REF] == 0
        anon += int(ent[e * K.NE + K.E_ANON])
        queued += 1
        e = int(ent[e * K.NE + K.E_NEXT])
    assert queued + anon == setup.num_blocks
    live = int(st[K.E_NEW])
    recycled, e = 0, int(st[K.E_RECYCLED])
    while e >= 0:
        recycled += 1
        e = int(ent[e * K.NE + K.E_COPY])
    assert live - recycled == queued  # every entry not evicted is a free cached block
    assert np.all(state.req[:state.loaded, K.CACHED] == 0)


def one_at_a_time(prompts, outputs, ids, hash_block, slots, b, caching=True):
    n = len(prompts)

    def make():
        yield RequestChunk(np.arange(n, dtype=float) * 100.0, np.asarray(prompts, dtype=np.int64),
                           np.asarray(outputs, dtype=np.int64), ids, hash_block)

    sched = SchedulerConfig(1, 10_000, 16, True, "recompute", 0, False, caching)
    spec = AllocatorSpec("paged", block_size=b)
    return Workload("hand", "", 0, "serve", n, PoolSpec(slots), (spec,), sched, TimingConfig(), make), spec


def test_a_repeated_prompt_hits_all_but_its_last_token():
    """By hand: B = 4, prompt of 12 tokens (3 hash blocks), sent twice, one at a time. The
    second finds 2 blocks cached: 3 would leave no prompt token to compute (vLLM keeps one)."""
    wl, spec = one_at_a_time([12, 12], [2, 2], [(1, 2, 3), (1, 2, 3)], 4, 64, 4)
    r = simulate(wl, spec, record_requests=True)
    assert r.requests.columns["cached_tokens"].tolist() == [0, 8]
    assert r.prefix.hit_rate == pytest.approx(8 / 24)
    assert r.steps == 2 + 2  # prefill (12 tokens) + 1 decode; then prefill of 4 tokens + 1 decode


def test_prefix_caching_off_prefills_everything_again():
    wl, spec = one_at_a_time([12, 12], [2, 2], [(1, 2, 3), (1, 2, 3)], 4, 64, 4, caching=False)
    r = simulate(wl, spec)
    assert r.prefix is None and r.to_dict()["prefix_cache"] is None


def test_eviction_takes_the_least_recently_freed_block_first():
    """By hand: B = H = 4, a pool of 4 blocks (0-3), requests one at a time, 9-token prompts of
    2 hash blocks and 1 output token (each ends holding 9 tokens: 3 blocks).
    A takes 0, 1, 2 (caching 0 as id 1, 1 as id 2) and frees them tail first: queue 3, 2, 1, 0.
    B (ids 7, 8) takes 3, 2, 1 from the front, evicting 1 (id 2); caches 3 (id 7), 2 (id 8); frees
    1, 2, 3: queue 0, 1, 2, 3. C (A's ids again) finds id 1 in block 0 but id 2 gone: 4 tokens hit;
    it takes 2 new blocks, 1 and 2, evicting 2 (id 8). Evictions: 2."""
    wl, spec = one_at_a_time([9, 9, 9], [1, 1, 1], [(1, 2), (7, 8), (1, 2)], 4, 16, 4)
    for run in (simulate, simulate_reference):
        r = run(wl, spec, record_requests=True)
        assert r.requests.columns["cached_tokens"].tolist() == [0, 0, 4]
        assert (r.prefix.evicted, r.prefix.reused) == (2, 1)


def test_shared_blocks_count_once_in_memory():
    """Two requests at once sharing 2 of 3 blocks: the second starts after the shared 8 tokens."""
    def make():
        yield RequestChunk(np.array([0.0, 0.0]), np.array([9, 9]), np.array([50, 50]),
                           [(1, 2), (1, 2)], 4)

    sched = SchedulerConfig(2, 9, 64, True, "recompute", 0, False, True)
    spec = AllocatorSpec("paged", block_size=4)
    wl = Workload("two", "", 0, "serve", 2, PoolSpec(400), (spec,), sched, TimingConfig(), make)
    r = simulate(wl, spec, record_requests=True)
    # step 1: A prefills 9 tokens (3 blocks, ids 1, 2 cached); step 2: A decodes, B is admitted
    # with 2 hits and computes its 9th token: B holds 2 shared + 1 own block.
    assert r.requests.columns["cached_tokens"].tolist() == [0, 8]
    assert r.peak_running == 2
    fast = simulate(wl, spec, record_requests=True)
    slow = simulate_reference(wl, spec, record_requests=True)
    assert as_json(fast) == as_json(slow)
    assert r.utilization <= 1.0 and r.breakdown["internal"] >= 0


TRACES = [("mooncake", "mooncake-fast25/conversation_trace.jsonl", 20_000),
          ("mooncake", "mooncake-fast25/synthetic_trace.jsonl", 20_000),
          ("agentic", "kv-cache-tester-agentic", 13_000)]  # holds its longest request unclipped


@pytest.mark.parametrize("fmt,rel,blocks", TRACES, ids=[t[1] for t in TRACES])
def test_one_request_at_a_time_hits_what_the_replay_finds(tmp_path, fmt, rel, blocks):
    """The serve engine with max_num_seqs 1 against the prefix replay (max_running 1, outputs
    held) on the shipped traces, in a pool small enough to evict: the same hits, token for token."""
    from kvplan.experiments import document, load
    from tests.conftest import shared_dir

    trace = shared_dir() / "traces" / rel
    if not trace.exists():
        pytest.skip(f"{trace} not present")
    b = 16
    common = (f"requests:\n  trace: {{format: {fmt}, path: {trace}, too_long: clip}}\n"
              f"pool: {{slots: {blocks * b}}}\nallocators: [{{kind: paged, block_size: {b}}}]\n")
    serve = tmp_path / "serve.yaml"
    serve.write_text("experiment: serve\n" + common + f"scheduler: {{max_num_seqs: 1, null_block: false, "
                     f"max_model_len: {blocks * b}, max_num_batched_tokens: {blocks * b}}}\n")
    replay = tmp_path / "replay.yaml"
    replay.write_text("experiment: prefix\n" + common + f"scheduler: {{max_model_len: {blocks * b}}}\n"
                      "prefix: {max_running: 1, hold_output: true}\n")
    served = document(load(serve))["results"][0]["prefix_cache"]
    replayed = document(load(replay))["results"][0]
    assert replayed["skipped"] == 0
    assert served["hit_tokens"] == replayed["hits"] and served["query_tokens"] == replayed["queries"]
    assert served["prefix_hit_rate"] == replayed["hit_rate"]
    assert served["blocks_evicted"] > 0  # the pool was small enough to matter
