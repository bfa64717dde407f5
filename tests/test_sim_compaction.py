"""Bounded memory on long prefix-sharing streams (kvplan/sim/prefix_ids.py): the engines drop the
trie nodes and identities nothing refers to and renumber the rest. A compacted run is the run
without compaction, to the byte (each engine against its step-by-step reference, which never
compacts, with compaction forced at every chunk), and what an engine holds stays bounded while
the distinct prefixes it has seen grow with the stream."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvplan.sim import inputs, prefix_ids
from kvplan.sim.engine import new_state, simulate
from kvplan.sim.inputs import make_setup, prepared_chunks
from kvplan.sim.prefix_ids import PrefixTrie
from kvplan.workload.records import (AllocatorSpec, PoolSpec, RequestChunk, SchedulerConfig, SglangConfig,
                                     TimingConfig, Workload)
from tests.test_sim_engine import assert_engines_agree
from tests.test_sim_offload import assert_agree as assert_offload_agrees, random_offload_workload
from tests.test_sim_prefix_serve import random_prefix_workload
from tests.test_sim_sglang import assert_agree as assert_sglang_agrees, random_sglang_workload


@pytest.fixture
def compact_always(monkeypatch):
    """Compaction at every chunk an engine loads, and pieces of 5 identity blocks; counts compactions."""
    monkeypatch.setattr(prefix_ids, "COMPACT_FLOOR", 0)
    monkeypatch.setattr(prefix_ids, "COMPACT_GROWTH", 1)
    monkeypatch.setattr(prefix_ids, "COMPACT_DROP", 0)
    monkeypatch.setattr(inputs, "ID_PIECE", 5)
    calls = []
    compact = PrefixTrie.compact

    def counted(self, live):
        calls.append(int(live.sum()))
        return compact(self, live)

    monkeypatch.setattr(PrefixTrie, "compact", counted)
    return calls


def chain(parents_and_ids, trie: PrefixTrie) -> list[int]:
    chunk = RequestChunk(np.zeros(1), np.array([16 * len(parents_and_ids)]), np.array([1]),
                         [tuple(parents_and_ids)], 16)
    return trie.encode(chunk, chunk.prompt_len).nodes.tolist()


def test_compact_keeps_the_live_nodes_and_their_ancestors_in_order():
    trie = PrefixTrie(16)
    assert chain([1, 2, 3], trie) == [0, 1, 2]
    assert chain([1, 2, 4], trie) == [0, 1, 3]
    assert chain([5, 6], trie) == [4, 5]
    assert chain([7], trie) == [6]
    live = np.zeros(7, dtype=bool)
    live[[3, 4]] = True  # 1-2-4 (with its ancestors 1 and 1-2) and 5; not 1-2-3, 5-6 or 7
    remap = trie.compact(live)
    assert remap.tolist() == [0, 1, -1, 2, 3, -1, -1]
    assert trie.num_nodes == 4 and trie.epoch == 1
    assert chain([1, 2, 4], trie) == [0, 1, 2]  # the kept path, renumbered in its old order
    assert chain([5, 6], trie) == [3, 4]  # 5 kept, 5-6 made new
    assert chain([1, 2, 3], trie) == [0, 1, 5]


@pytest.mark.parametrize("budget", [1, 3, 10, 100, 1000])
def test_pieces_hold_about_their_budget_of_identities(budget, monkeypatch):
    """As few pieces as the budget allows, each within one request of an equal share."""
    monkeypatch.setattr(inputs, "ID_PIECE", budget)
    rng = np.random.default_rng(budget)
    ids = [tuple(range(int(k))) for k in rng.integers(0, 7, 200)]
    chunk = RequestChunk(np.zeros(200), np.full(200, 200), np.ones(200, dtype=np.int64), ids, 16)
    parts = inputs.id_pieces(chunk)
    assert parts[0].start == 0 and parts[-1].stop == 200
    assert all(a.stop == b.start and a.stop > a.start for a, b in zip(parts, parts[1:] + [slice(200, 201)]))
    total = sum(map(len, ids))
    m = -(-total // budget)
    assert len(parts) == min(m, 200) or (m > 200 and len(parts) <= 200)
    for part in parts:
        held = sum(map(len, ids[part]))
        assert held <= total / m + 6 or part.stop - part.start == 1


def test_a_chunk_numbered_before_a_compaction_is_refused():
    wl, spec, _ = random_prefix_workload(3, big=True)
    setup = make_setup(wl, spec)
    chunks = prepared_chunks(wl, setup)
    first = next(chunks)
    first.ids.trie.compact(np.zeros(first.ids.trie.num_nodes, dtype=bool))
    with pytest.raises(AssertionError, match="compacted"):
        new_state(setup).load(first)


@pytest.mark.parametrize("seed", range(60))
def test_vllm_compacted_at_every_chunk_equals_the_reference(seed, compact_always):
    assert_engines_agree(*random_prefix_workload(seed, big=seed % 2 == 1))


@pytest.mark.parametrize("seed", range(30))
def test_vllm_with_a_cpu_tier_compacted_at_every_chunk_equals_the_reference(seed, compact_always):
    assert_offload_agrees(*random_offload_workload(seed, big=seed % 2 == 1))


@pytest.mark.parametrize("seed", range(60))
def test_sglang_compacted_at_every_chunk_equals_the_reference(seed, compact_always):
    wl, points = random_sglang_workload(seed, big=seed % 2 == 1)
    assert_sglang_agrees(wl, points)


def test_the_random_cases_do_compact_and_drop(compact_always):
    """The cases above compact with nodes to drop (else they would prove little)."""
    for seed in range(10):
        wl, spec, _ = random_prefix_workload(seed, big=True)
        simulate(wl, spec)
        wl, _ = random_sglang_workload(seed, big=True)
        simulate(wl, wl.allocators[0])
    assert len(compact_always) >= 200
    assert sum(1 for live in compact_always if live == 0) < len(compact_always) / 2


def stream(n: int, engine: str) -> Workload:
    """n requests, one a step, each a shared 4-block prefix (one of 8) and 6 blocks of its own."""
    def make():
        for s in range(0, n, 500):
            m = min(500, n - s)
            ids = [tuple([i % 8] * 4 + [10**9 + 6 * i + k for k in range(6)]) for i in range(s, s + m)]
            yield RequestChunk(np.arange(s, s + m, dtype=np.float64), np.full(m, 160), np.full(m, 4), ids, 16)

    sched = SchedulerConfig(16, 2048, 4096, True, "recompute", 0, False, True)
    spec = AllocatorSpec("paged", block_size=16)
    return Workload("stream", "", 0, "serve", n, PoolSpec(16 * 400), (spec,), sched, TimingConfig(), make,
                    sglang=SglangConfig() if engine == "sglang" else None)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_what_an_engine_holds_stays_bounded_as_the_stream_grows(engine, monkeypatch):
    """Every request brings 6 blocks no other shares, so without compaction the trie and the
    identities grow by 6 (and 10) per request; with it, a stream 8 times as long holds no more."""
    monkeypatch.setattr(prefix_ids, "COMPACT_FLOOR", 256)
    monkeypatch.setattr(inputs, "ID_PIECE", 1000)

    def peak(n):
        wl = stream(n, engine)
        setup = make_setup(wl, wl.allocators[0])
        state, most = new_state(setup), [0, 0]
        for chunk in prepared_chunks(wl, setup):
            state.load(chunk)
            state.run(final=False)
            most = [max(most[0], chunk.ids.trie.num_nodes), max(most[1], state.n_ids)]
        state.run(final=True)
        assert state.outstanding == 0
        return most

    short, long = peak(2000), peak(16000)
    assert short[0] < 6 * 2000 and short[1] < 10 * 2000  # it compacted already
    assert long[0] <= 1.1 * short[0] and long[1] <= 1.1 * short[1]


def test_a_fleet_compacting_its_replicas_is_the_fleet_that_does_not(tmp_path, monkeypatch):
    """Each replica's trie is compacted on its own, and the routers that read it (prefix-aware,
    llm-d's precise index) route as before."""
    from kvplan.experiments import load
    from kvplan.fleet.run import simulate_fleet

    text = """name: f
experiment: fleet
seed: 3
model: meta-llama/Llama-3.1-8B-Instruct
gpu: H100-80GB
pool: {gpu_memory_utilization: 0.92}
requests:
  count: 3000
  prompt: {dist: lognormal, mean: 600, sigma: 1.0}
  output: {dist: lognormal, mean: 60, sigma: 1.0}
  arrival: {process: poisson, rate: 60}
prefix: {system_prompts: 6, system_prompt_len: 256, hash_block_size: 16}
replicas:
  - {count: 3}
"""
    out = {}
    for router in ("prefix_aware", "llm_d", "sglang", "round_robin"):
        path = tmp_path / f"{router}.yaml"
        path.write_text(text + f"router: {router}\n")
        for floor in (1 << 16, 64):
            monkeypatch.setattr(prefix_ids, "COMPACT_FLOOR", floor)
            out[router, floor] = json.dumps(simulate_fleet(load(path)).to_dict(), sort_keys=True)
        assert out[router, 64] == out[router, 1 << 16]
