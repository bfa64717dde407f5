"""Trace replay through the prefix cache against independent computations; synthetic prefixes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvplan.errors import KvplanError
from kvplan.replay.prefix import hit_rate_sweep, prompt_block_ids, replay_prefix_cache
from kvplan.workload.chunks import RequestChunk
from kvplan.workload.prefixes import PrefixGenerator, blocks_per_hash, synthetic_prefixes, with_prefixes
from kvplan.workload.spec import PrefixSpec
from tests.conftest import shared_dir


def chunk(prompts, ids, hash_block_size, outputs=None) -> RequestChunk:
    n = len(prompts)
    out = np.zeros(n, dtype=np.int64) if outputs is None else np.asarray(outputs, dtype=np.int64)
    return RequestChunk(np.arange(n, dtype=float), np.asarray(prompts, dtype=np.int64), out,
                        [tuple(i) for i in ids], hash_block_size)  # fmt: skip


def random_trace(rng: random.Random, n: int, hash_block_size: int, partial_ids: bool):
    """Prompts built from a few shared hash-id paths: a small tree of prefixes, so requests share.

    partial_ids: a partial last trace block has an id too (Mooncake), else not (agentic)."""
    prompts, ids = [], []
    for _ in range(n):
        blocks = rng.randint(0, 5)
        path = [rng.randint(0, 2) * 10 + j for j in range(blocks)]  # ids depend on the position
        prompt = blocks * hash_block_size + rng.randint(0, hash_block_size - 1)
        prompt = max(prompt, 1)
        if partial_ids and prompt % hash_block_size:
            path.append(999)
        prompts.append(prompt)
        ids.append(path[: -(-prompt // hash_block_size)] if partial_ids else path)
    return prompts, ids


def prefix_keys(prompt, path, block_size, hash_block_size, trie: dict) -> list[int]:
    """One number per full block naming its whole prefix: a trie of (parent, (id, sub-block))
    entries that never forgets, so equal numbers mean equal prefixes."""
    per, keys, parent = hash_block_size // block_size, [], 0
    for h in path[: prompt // hash_block_size]:
        for s in range(per):
            parent = trie.setdefault((parent, (h, s)), len(trie) + 1)
            keys.append(parent)
    return keys


def reference_lru(prompts, ids, num_blocks: int, block_size: int, hash_block_size: int):
    """An independent replay, one request at a time: plain lists, keys name whole prefixes.

    Returns (replayed, skipped, hit tokens, query tokens)."""
    trie: dict = {}
    queue, content, where = list(range(num_blocks)), [None] * num_blocks, {}
    hits_total = queries = replayed = skipped = 0
    for prompt, path in zip(prompts, ids):
        need = -(-prompt // block_size)
        if need > num_blocks:
            skipped += 1
            continue
        keys = prefix_keys(prompt, path, block_size, hash_block_size, trie)
        hits = []
        for j in range(min(len(keys), (prompt - 1) // block_size)):
            slot = where.get(keys[j])
            if slot is None:
                break
            hits.append(slot)
        for slot in hits:
            queue.remove(slot)
        new, queue = queue[: need - len(hits)], queue[need - len(hits) :]
        for slot in new:
            if content[slot] is not None:
                del where[content[slot]]
                content[slot] = None
        table = hits + new
        for j in range(len(hits), len(keys)):
            key = keys[j]
            if key in where:
                break
            where[key], content[table[j]] = table[j], key
        queue += table[::-1]
        hits_total, queries = hits_total + len(hits) * block_size, queries + prompt
        replayed += 1
    return replayed, skipped, hits_total, queries


def seen_before_hits(prompts, ids, block_size: int, hash_block_size: int) -> int:
    """An infinite cache's hit tokens: blocks whose whole prefix was seen before (a Python set)."""
    trie, seen, hits = {}, set(), 0
    for prompt, path in zip(prompts, ids):
        keys = prefix_keys(prompt, path, block_size, hash_block_size, trie)
        run = 0
        while run < min(len(keys), (prompt - 1) // block_size) and keys[run] in seen:
            run += 1
        hits += run * block_size
        seen.update(keys)
    return hits


def test_trace_blocks_map_onto_simulated_blocks():
    """Fails if a hash id does not become H/B sub-block identities, or if a partial last trace
    block (Mooncake) or the tokens past the last id are given identities."""
    assert prompt_block_ids([7, 9, 4], 1100, 512, 256) == [14, 15, 18, 19]  # 1100 // 512 = 2 blocks
    assert prompt_block_ids([7, 9], 1024, 512, 512) == [7, 9]
    assert prompt_block_ids([3], 130, 64, 16) == [12, 13, 14, 15]
    assert blocks_per_hash(512, 16) == 32


@pytest.mark.parametrize("block_size", [24, 1024])
def test_a_block_size_that_does_not_divide_the_hash_block_is_an_error(block_size):
    """Fails if a trace is replayed on simulated blocks that split its hash blocks unevenly."""
    with pytest.raises(KvplanError, match="does not divide"):
        replay_prefix_cache([chunk([600], [[1, 2]], 512)], 100, block_size)


@pytest.mark.parametrize("seed", range(25))
def test_replay_equals_an_independent_lru(seed):
    """Fails if the one-at-a-time replay differs from a plain-list LRU keyed by whole prefixes."""
    rng = random.Random(seed)
    hash_size = rng.choice([4, 8])
    block_size = rng.choice([b for b in (1, 2, 4, 8) if hash_size % b == 0])
    prompts, ids = random_trace(rng, 60, hash_size, partial_ids=rng.random() < 0.5)
    num_blocks = rng.randint(1, 40)
    got = replay_prefix_cache([chunk(prompts, ids, hash_size)], num_blocks, block_size)
    want = reference_lru(prompts, ids, num_blocks, block_size, hash_size)
    assert (got.requests, got.skipped, got.stats.hit_tokens, got.stats.query_tokens) == want


@pytest.mark.parametrize("seed", range(10))
def test_an_infinite_cache_hits_every_prefix_seen_before(seed):
    """Fails if a cache that never evicts misses a block whose prefix an earlier request had."""
    rng = random.Random(seed)
    prompts, ids = random_trace(rng, 80, 8, partial_ids=True)
    got = replay_prefix_cache([chunk(prompts, ids, 8)], 10_000, 4, max_running=3)
    assert got.stats.hit_tokens == seen_before_hits(prompts, ids, 4, 8)
    assert got.stats.blocks_evicted == 0


def test_agentic_sample_in_an_infinite_cache():
    """Fails if the agentic traces (64-token blocks, nested sub-agents) replay differently from the
    set-of-prefixes count, or if their 64-token ids do not map onto blocks of 16."""
    from kvplan.workload.traces import open_trace

    folder = shared_dir() / "traces" / "kv-cache-tester-agentic"
    if not folder.is_dir():
        pytest.skip("agentic traces not present")
    trace = open_trace("agentic", folder)
    chunks = list(trace.chunks())
    prompts = [p for c in chunks for p in c.prompt_len.tolist()]
    ids = [h for c in chunks for h in c.hash_ids]
    assert trace.num_requests == len(prompts) == 370 - 6 + 44 + 12
    got = replay_prefix_cache(chunks, 2_000_000, 16)
    assert got.stats.hit_tokens == seen_before_hits(prompts, ids, 16, 64)
    assert 0.8 < got.hit_rate < 1  # agentic sessions resend their whole history


def test_mooncake_head_against_the_independent_lru():
    """Fails if the first 400 Mooncake requests replay differently from the plain-list LRU."""
    from kvplan.workload.traces import open_trace

    path = shared_dir() / "traces" / "mooncake-fast25" / "conversation_trace.jsonl"
    if not path.is_file():
        pytest.skip("Mooncake trace not present")
    chunks = list(open_trace("mooncake", path, limit=400).chunks())
    prompts = [p for c in chunks for p in c.prompt_len.tolist()]
    ids = [h for c in chunks for h in c.hash_ids]
    for num_blocks, block_size in ((300, 512), (2000, 128), (6000, 32)):
        got = replay_prefix_cache(chunks, num_blocks, block_size)
        want = reference_lru(prompts, ids, num_blocks, block_size, 512)
        assert (got.requests, got.skipped, got.stats.hit_tokens, got.stats.query_tokens) == want


def test_concurrent_requests_share_blocks_in_use():
    """Fails if a request cannot hit blocks another running request holds, or if max_running does
    not bound how many requests hold blocks (the oldest finishes first)."""
    reqs = chunk([9, 9, 9], [[1, 2], [1, 2], [1, 2]], 4)
    both = replay_prefix_cache([reqs], 8, 4, max_running=3)
    s = both.stats
    assert (s.hit_tokens, s.blocks_reused, s.blocks_evicted) == (16, 0, 0)  # hits on blocks in use
    alone = replay_prefix_cache([reqs], 8, 4, max_running=1)
    assert (alone.stats.hit_tokens, alone.stats.blocks_reused) == (16, 4)  # revived from the free list
    tight = replay_prefix_cache([reqs], 4, 4, max_running=3)  # 3 blocks each: the oldest goes early
    assert tight.stats.hit_tokens == 16 and tight.requests == 3


def test_outputs_hold_blocks_but_are_never_cached():
    """Fails if hold_output ignores output tokens, caches them, or lets them be hit."""
    reqs = chunk([8, 8], [[1, 2], [1, 2]], 4, outputs=[8, 8])
    off = replay_prefix_cache([reqs], 4, 4)
    on = replay_prefix_cache([reqs], 4, 4, hold_output=True)
    # Both: B reuses block 0 only (the last block of a fully cached prompt is recomputed).
    assert (off.stats.hit_tokens, off.stats.blocks_evicted) == (4, 0)
    # A held 4 blocks and freed them tail first (3 2 1 0); B's prompt takes 3, its output 2 and 1,
    # evicting A's second prompt block.
    assert (on.stats.hit_tokens, on.stats.blocks_evicted, on.stats.blocks_reused) == (4, 1, 1)
    assert replay_prefix_cache([reqs], 3, 4, hold_output=True).skipped == 2


def test_requests_without_ids_or_larger_than_the_pool():
    """Fails if tokens without ids are shared, or a prompt larger than the pool is not skipped."""
    plain = RequestChunk(np.zeros(3), np.array([40, 40, 400]), np.zeros(3, dtype=np.int64))
    r = replay_prefix_cache([plain], 20, 4)
    assert (r.requests, r.skipped, r.stats.hit_tokens, r.stats.query_tokens) == (2, 1, 0, 80)
    assert r.to_dict()["hit_rate"] == 0.0 and r.to_dict()["stats"]["queries"] == 80


def test_caching_off_never_hits():
    """Fails if enable_caching=False still serves tokens from a cache."""
    prompts, ids = random_trace(random.Random(1), 50, 8, partial_ids=False)
    r = replay_prefix_cache([chunk(prompts, ids, 8)], 100, 4, enable_caching=False)
    assert r.stats.hit_tokens == 0 and r.requests == 50


def test_sweep_runs_one_replay_per_size_and_reaches_the_infinite_limit():
    """Fails if the sweep drops or reorders sizes, or its largest size is not an infinite cache."""
    prompts, ids = random_trace(random.Random(3), 200, 8, partial_ids=True)
    make = lambda: [chunk(prompts, ids, 8)]  # noqa: E731
    results = hit_rate_sweep(make, [5, 50, 100_000], 4)
    assert [r.num_blocks for r in results] == [5, 50, 100_000]
    assert results[-1].stats.hit_tokens == seen_before_hits(prompts, ids, 4, 8)
    assert results[0].hit_rate <= results[-1].hit_rate
    with pytest.raises(KvplanError):
        hit_rate_sweep(make, [], 4)


# ---- synthetic prefixes ---------------------------------------------------------------------


def test_multi_turn_prompts_extend_the_previous_turn():
    """Fails if a turn's prompt is not the previous prompt + answer + its own tokens, or if the
    conversation does not restart after `turns` turns."""
    own, answers = np.array([40, 30, 20, 50, 10]), np.array([5, 7, 9, 11, 13])
    lens, ids = synthetic_prefixes(own, answers, np.random.default_rng(0), system_prompts=1,
                                   system_prompt_len=100, turns=3, sessions=1, hash_block_size=16)
    assert lens.tolist() == [140, 140 + 5 + 30, 175 + 7 + 20, 150, 150 + 11 + 10]
    assert [len(i) for i in ids] == [n // 16 for n in lens.tolist()]
    assert ids[1][: len(ids[0])] == ids[0] and ids[2][: len(ids[1])] == ids[1]
    assert ids[3][:6] == ids[0][:6] == tuple(range(6))  # the system prompt's 6 full blocks
    assert ids[3][6] != ids[0][6]  # the block across the system prompt's end: per conversation


def test_system_prompt_popularity():
    """Fails if zipf does not favour prompt 0, or uniform does."""
    n = 4000
    for popularity, lo, hi in (("zipf", 0.45, 0.75), ("uniform", 0.2, 0.3)):
        _, ids = synthetic_prefixes(np.full(n, 10), np.zeros(n), np.random.default_rng(1),
                                    system_prompts=4, system_prompt_len=[32, 32, 32, 32],
                                    popularity=popularity, zipf_a=1.5,
                                    hash_block_size=16)  # fmt: skip
        share = sum(i[0] == 0 for i in ids) / n
        assert lo < share < hi, (popularity, share)


def test_generated_prefixes_replay_like_the_set_count_and_carry_across_chunks():
    """Fails if generated ids are not prefix-consistent (an infinite cache must hit exactly the
    prefixes seen before) or if splitting the stream into chunks changes what is generated."""
    spec = PrefixSpec(system_prompts=3, system_prompt_len=(50, 200, 17), turns=4, sessions=5,
                      hash_block_size=8, max_prompt_len=600)  # fmt: skip
    rng = np.random.default_rng(7)
    own, out = rng.integers(1, 60, 300), rng.integers(1, 60, 300)
    whole = PrefixGenerator(spec, np.random.default_rng(2)).apply(
        RequestChunk(np.zeros(300), own, out))
    parts = list(with_prefixes((RequestChunk(np.zeros(100), own[i : i + 100], out[i : i + 100])
                                for i in range(0, 300, 100)), spec, np.random.default_rng(2)))
    assert sum((p.hash_ids for p in parts), []) != [] and max(whole.prompt_len) <= 600
    r = replay_prefix_cache([whole], 100_000, 4)
    assert r.stats.hit_tokens == seen_before_hits(whole.prompt_len.tolist(), whole.hash_ids, 4, 8)
    assert r.hit_rate > 0.5


def test_prefix_spec_validation_names_the_field():
    """Fails if a bad prefix section is accepted or the error does not say which key."""
    for bad in ({"popularity": "pareto"}, {"turns": 0}, {"system_prompt_len": [1, 2]},
                {"zipf_a": 0}):  # fmt: skip
        with pytest.raises(KvplanError) as err:
            PrefixSpec(**bad)
        assert err.value.field == next(iter(bad))  # relative to the record; a reader says where it stands
    spec = PrefixSpec(system_prompts=2, system_prompt_len=5)
    assert spec.to_dict()["system_prompt_len"] == [5, 5]


def test_prefix_spec_rejects_wrong_types():
    """Fails if a string, bool or float sneaks into an integer field as a TypeError, not a
    KvplanError naming the key."""
    for bad in ({"turns": "4"}, {"sessions": True}, {"system_prompts": 2.0},
                {"system_prompt_len": "long"}, {"zipf_a": "x"}, {"max_prompt_len": 0}):  # fmt: skip
        with pytest.raises(KvplanError) as err:
            PrefixSpec(**bad)
        assert err.value.field == next(iter(bad))  # relative to the record; a reader says where it stands


def test_a_stream_whose_hash_block_size_changes_is_an_error():
    """Fails if chunks with different hash block sizes are silently mixed in one replay."""
    with pytest.raises(KvplanError, match="hash block size"):
        replay_prefix_cache([chunk([64], [[1]], 64), chunk([32], [[1]], 32)], 100, 16)


def test_result_dict_keys_are_stable():
    """Fails if the replay's dict loses or renames a key the CLI's JSON output relies on."""
    d = replay_prefix_cache([chunk([9], [[1, 2]], 4)], 8, 4).to_dict()
    assert list(d) == ["num_blocks", "block_size", "max_running", "hold_output", "enable_caching",
                       "requests", "skipped", "stats", "hit_rate", "cache_tokens"]  # fmt: skip
    assert list(d["stats"]) == ["requests", "queries", "hits", "blocks_reused", "blocks_evicted",
                                "hit_rate", "prefill_tokens_saved"]  # fmt: skip


def test_no_system_prompts_is_a_stream_of_fresh_blocks():
    """prefix: {system_prompts: 0} (found by the fleet fuzz test): every block gets a fresh id."""
    import numpy as np

    from kvplan.workload.prefixes import with_prefixes
    from kvplan.workload.chunks import RequestChunk

    chunk = RequestChunk(np.zeros(3), np.array([40, 40, 40]), np.array([5, 5, 5]))
    out = list(with_prefixes(iter([chunk]), PrefixSpec(system_prompts=0, hash_block_size=16),
                             np.random.default_rng(0)))
    ids = [i for c in out for h in c.hash_ids for i in h]
    assert ids and len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
