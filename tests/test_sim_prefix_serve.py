"""Automatic prefix caching inside the serve engines: the fast engine against the block-by-block
reference on random workloads with shared prefixes, conservation, and hand-checked cases."""

from __future__ import annotations

import numpy as np
import pytest

from kvplan.sim import kernel as K
from kvplan.sim.engine import KernelState, simulate
from kvplan.sim.inputs import make_setup, prepared_chunks
from kvplan.sim.reference import simulate_reference
from kvplan.workload.records import (AllocatorSpec, PoolSpec, RequestChunk, SchedulerConfig,
                                     TimingConfig, Workload)
from tests.test_sim_engine import as_json, assert_engines_agree, random_timing, run_to_end


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
    timing = random_timing(rng, timed)
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
    assert_engines_agree(*random_prefix_workload(seed))


@pytest.mark.parametrize("seed", range(30))
def test_engine_equals_reference_with_prefix_caching_larger(seed):
    assert_engines_agree(*random_prefix_workload(seed, big=True))


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
    setup, state = run_to_end(*random_prefix_workload(seed, big=seed % 2 == 1)[:2])
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
        assert (r.prefix.blocks_evicted, r.prefix.blocks_reused) == (2, 1)


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
    replay.write_text("experiment: prefix\n" + common + f"scheduler: {{max_model_len: {blocks * b}, null_block: false}}\n"
                      "prefix: {max_running: 1, hold_output: true}\n")
    served = document(load(serve))["results"][0]["prefix_cache"]
    replayed = document(load(replay))["results"][0]
    assert replayed["skipped"] == 0
    assert served["hit_tokens"] == replayed["hits"] and served["query_tokens"] == replayed["queries"]
    assert served["prefix_hit_rate"] == replayed["hit_rate"]
    assert served["blocks_evicted"] > 0  # the pool was small enough to matter


# -- hybrid layer groups -------------------------------------------------------------------------

from kvplan.model.layout import KVLayout, LayerGroup  # noqa: E402


def small_hybrid_layout(rng) -> KVLayout:
    """A tiny model of sliding and full layers (and sometimes recurrent state), small windows."""
    groups = [LayerGroup("full", int(rng.integers(1, 3)), 1, 4, 4),
              LayerGroup("sliding", int(rng.integers(1, 6)), 1, 4, 4, window=int(rng.integers(2, 40)))]
    if rng.random() < 0.3:
        groups = [groups[0], LayerGroup("state", int(rng.integers(1, 6)), state_elems=8)]
    elif rng.random() < 0.3:
        groups.append(LayerGroup("state", int(rng.integers(1, 4)), state_elems=8))
    return KVLayout("tiny-hybrid", "auto", 1, tuple(groups), None)


def random_hybrid_workload(seed: int, big: bool = False):
    from kvplan.model.vllm_kv_groups import kv_groups

    rng = np.random.default_rng([seed, 99, int(big)])
    layout = small_hybrid_layout(rng)
    b = int(rng.choice([1, 2, 4, 8, 16]))
    groups = kv_groups(layout, b)
    if groups is None:
        return None
    mml = int(rng.integers(16, 200) if big else rng.integers(8, 64))
    n = int(rng.integers(40, 160) if big else rng.integers(1, 30))
    prompt = rng.integers(1, mml, n)
    output = np.minimum(rng.integers(0, 80, n), mml - prompt)
    arrival = np.cumsum(rng.exponential(rng.choice([0.5, 3, 20]), n))
    chunked = bool(rng.random() < 0.6)
    budget = int(rng.integers(1, 2 * mml)) if chunked else int(rng.integers(mml, 2 * mml + 1))
    mode = "swap" if rng.random() < 0.3 else "recompute"
    seqs = int(rng.integers(1, 24 if big else 10))
    sched = SchedulerConfig(seqs, max(budget, seqs) if chunked else budget, mml, chunked, mode,
                            int(rng.integers(0, 8 * mml)), bool(rng.random() < 0.5))
    need = groups.blocks_per_request(mml, sched.max_num_batched_tokens) + 1
    blocks = int(rng.integers(need, 4 * need + 2))
    kv = blocks * groups.page * groups.group_size
    timing = TimingConfig()
    if rng.random() < 0.5:
        arrival *= 1e-6
        timing = TimingConfig("test-gpu", 1e12, 1e12, int(rng.integers(0, 300_000)),
                              float(rng.integers(0, 50_000)), int(rng.integers(0, 20_000)), 1.0, 1.0, 0.0)

    def make():
        yield RequestChunk(arrival, prompt, output)

    spec = AllocatorSpec("paged", block_size=b)
    pool = PoolSpec(kv // layout.bytes_per_token, layout.bytes_per_token, kv)
    wl = Workload("random-hybrid", "", seed, "serve", n, pool, (spec,), sched, timing, make, layout=layout)
    return wl, spec, int(rng.choice([4, 8, 64, 2048]))


@pytest.mark.parametrize("seed", range(200))
def test_engine_equals_reference_with_hybrid_groups(seed):
    """Breaks if the fast engine's sliding-window release, state blocks or group accounting
    differ from the reference's."""
    made = random_hybrid_workload(seed, big=seed % 4 == 3)
    if made is None:
        pytest.skip("pages this layout cannot unify")
    assert_engines_agree(*made)


def test_sliding_window_blocks_by_hand():
    """B = 4, one full and one sliding group (window 6), 1 request of 8 prompt + 12 output tokens.
    It ends holding 19 tokens: the full group ceil(19 / 4) = 5 blocks; the sliding group released
    the blocks wholly before token 18 - 6 + 1 = 13 (computed before the last step: 18), i.e.
    13 // 4 = 3, and keeps 2; 7 blocks in all at the end instead of 10."""
    layout = KVLayout("hand", "auto", 1, (LayerGroup("full", 1, 1, 4, 4),
                                           LayerGroup("sliding", 1, 1, 4, 4, window=6)), None)
    from kvplan.model.vllm_kv_groups import kv_groups

    g = kv_groups(layout, 4)
    kv = 100 * g.page * g.group_size

    def make():
        yield RequestChunk(np.zeros(1), np.array([8]), np.array([12]))

    sched = SchedulerConfig(4, 64, 32, True, "recompute", 0, False)
    spec = AllocatorSpec("paged", block_size=4)
    wl = Workload("hand", "", 0, "serve", 1, PoolSpec(kv // layout.bytes_per_token, layout.bytes_per_token, kv),
                  (spec,), sched, TimingConfig(), make, layout=layout)
    setup = make_setup(wl, spec)
    assert (setup.num_blocks, setup.hybrid.full, setup.hybrid.sliding, setup.hybrid.window) == (100, 1, 1, 6)
    state = KernelState(setup)
    for chunk in prepared_chunks(wl, setup):
        state.load(chunk)
    req_before = []
    state.st[K.ALL_LOADED] = 1
    for _ in range(100):  # one event (a step: hybrid runs take no jumps) at a time
        if state.st[K.DONE] == 1:
            break
        K.run(*state.kernel_args(), 1)
        if state.st[K.NUM_RUNNING]:
            req_before.append(int(state.req[0, K.BLOCKS]))
    assert req_before[-1] == 5 + 2
    assert max(req_before) <= 5 + 3  # the sliding group never holds more than its window's blocks + 1
    assert state.st[K.FREE_BLOCKS] == 100


def test_random_hybrid_workloads_release_preempt_and_hold_state():
    """The random hybrid cases exercise sliding releases, preemption and state blocks."""
    released = preempted = state = 0
    for seed in range(80):
        made = random_hybrid_workload(seed, big=seed % 4 == 3)
        if made is None:
            continue
        setup, ks = run_to_end(*made[:2])
        released += bool((ks.req[:ks.loaded, K.SKIPPED] > 0).any())
        preempted += ks.st[K.PREEMPTIONS] > 0
        state += setup.hybrid.state > 0
    assert min(released, preempted, state) >= 15


def test_capacity_experiment_follows_the_hybrid_groups():
    """By hand: one full and one sliding layer (window 6), B = 4, 100 blocks, requests of final
    length 20: the full group takes 5 blocks, the sliding group keeps the blocks from the one
    holding token 20 - 6 = 14 on: 5 - 14 // 4 = 2; 7 a request, so 100 // 7 = 14 fit (all-full: 10)."""
    from kvplan.model.vllm_kv_groups import kv_groups
    from kvplan.replay.capacity import run_capacity

    layout = KVLayout("hand", "auto", 1, (LayerGroup("full", 1, 1, 4, 4),
                                           LayerGroup("sliding", 1, 1, 4, 4, window=6)), None)
    g = kv_groups(layout, 4)
    kv = 100 * g.page * g.group_size

    def make():
        yield RequestChunk(np.zeros(40), np.full(40, 15), np.full(40, 5))

    sched = SchedulerConfig(4, 64, 32, True, "recompute", 0, False)
    specs = (AllocatorSpec("paged", block_size=4), AllocatorSpec("paged", block_size=4, hybrid=False))
    wl = Workload("hand", "", 0, "capacity", 40, PoolSpec(kv // layout.bytes_per_token, layout.bytes_per_token, kv),
                  specs, sched, TimingConfig(), make, layout=layout)
    grouped, plain = run_capacity(wl)
    assert grouped.result.admitted == 14 and grouped.result.allocated_slots == 14 * 7 * 4
    assert plain.result.admitted == 10  # 200 slots of both layers / 20 tokens


def test_synthetic_prefixes_in_a_serve_workload(tmp_path):
    """The `prefix:` section gives a serve run's prompts shared system prompts; the engine's cache
    finds them, and the same run without caching follows for comparison."""
    from kvplan.errors import KvplanError
    from kvplan.experiments import document, load

    path = tmp_path / "serve.yaml"
    body = ("experiment: serve\npool: {slots: 200000}\nrequests:\n  count: 300\n"
            "  prompt: {dist: fixed, value: 200}\n  output: {dist: fixed, value: 20}\n"
            "  arrival: {process: poisson, rate: 0.5}\n"
            "scheduler: {max_model_len: 4096}\n"
            "prefix: {system_prompts: 2, system_prompt_len: 1024, hash_block_size: 16}\n")
    path.write_text(body)
    doc = document(load(path))
    on, off = doc["results"]
    assert (on["label"], off["label"]) == ("paged-B16", "paged-B16 no-cache")
    # 1,024 of every 1,224-token prompt is a system prompt, all cached after the first two
    assert 0.8 < on["prefix_cache"]["prefix_hit_rate"] < 1024 / 1224
    assert off["prefix_cache"] is None
    path.write_text(body.replace("hash_block_size: 16}", "hash_block_size: 16, max_running: 2}"))
    with pytest.raises(KvplanError, match="max_running"):
        document(load(path))
