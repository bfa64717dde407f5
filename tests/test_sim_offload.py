"""The CPU offload tier (kvplan/sim/offload.py): the fast engine against the reference on random
workloads with a tier, hand-counted hits and load times, the no-offload outputs unchanged, and a
multi-turn workload whose hit rate the tier raises."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvplan.errors import WorkloadError
from kvplan.sim import kernel as K
from kvplan.sim.engine import simulate
from kvplan.sim.reference import simulate_reference
from kvplan.workload.records import (AllocatorSpec, OffloadConfig, PoolSpec, RequestChunk, SchedulerConfig,
                                     TimingConfig, Workload)
from tests.test_sim_engine import as_json, run_to_end
from tests.test_sim_prefix_serve import random_prefix_workload


def random_offload_workload(seed: int, big: bool = False):
    """random_prefix_workload with a CPU tier of a few blocks and a link of a few ticks a block."""
    wl, spec, points = random_prefix_workload(seed, big)
    rng = np.random.default_rng([seed, 91, int(big)])
    b = spec.block_size
    blocks = int(rng.choice([1, 2, 5, 20, 200]))
    per_block = int(rng.choice([1, 3, 50])) if not wl.timing.gpu_name else int(rng.choice([1, 10**4, 10**7]))
    # block bytes = b x 1000 x per_block / b; ticks per block = bytes x 1e12 / (gb_per_s x 1e9)
    offload = OffloadConfig(cpu_bytes=blocks * 1000 * b, gb_per_s=b * 1.0 / per_block, gpu_bytes_per_token=1000)
    return replace(wl, offload=offload), spec, points


def assert_agree(wl, spec, points):
    """Both engines give the same result to the byte, or both refuse the run (a pool so small that
    requests waiting behind a load hold it: vLLM would stall there too)."""
    try:
        fast = simulate(wl, spec, record_requests=True, timeline_points=points)
    except WorkloadError as exc:
        assert exc.field == "offload"
        with pytest.raises(WorkloadError, match="hold the pool"):
            simulate_reference(wl, spec, record_requests=True, timeline_points=points)
        return None
    slow = simulate_reference(wl, spec, record_requests=True, timeline_points=points)
    assert as_json(fast) == as_json(slow)
    return fast


@pytest.mark.parametrize("seed", range(200))
def test_engine_equals_reference_with_offload(seed):
    """Breaks if a store, a touch, an eviction from the tier, a load's timing or a jump around a
    load differs between the fast engine and the step-by-step reference."""
    assert_agree(*random_offload_workload(seed))


@pytest.mark.parametrize("seed", range(20))
def test_engine_equals_reference_with_offload_larger(seed):
    assert_agree(*random_offload_workload(seed, big=True))


# -- by hand --------------------------------------------------------------------------------------

B = 16
BYTES_PER_TOKEN = 131_072  # Llama-3-8B's KV per token on one GPU
LOAD_PS = 83_886_080  # one block: 16 x 128 KiB = 2,097,152 bytes at 25 GB/s = 83.886080 us
STEP_PS = 1_000_000  # the roofline below: 1 us of weights, 1 ns per token of KV read, no compute


def three_requests(cpu_blocks: int, offload: bool = True):
    """A (hash blocks 1-4), B (5-8), then A's prompt again (C), 1 ms apart, on a pool of 5 blocks
    of 16: B takes A's three tail blocks from the GPU cache, A's head block stays cached."""
    prompt = np.full(3, 64, dtype=np.int64)

    def make():
        yield RequestChunk(np.array([0.0, 1e-3, 2e-3]), prompt, np.ones(3, dtype=np.int64),
                           [(1, 2, 3, 4), (5, 6, 7, 8), (1, 2, 3, 4)], B)

    sched = SchedulerConfig(4, 1000, 80, True, "recompute", 0, False, True)
    timing = TimingConfig("test-gpu", 1e12, 1e12, 1_000_000, 0.0, 1000, 1.0, 1.0, 0.0)
    tier = OffloadConfig(cpu_blocks * B * BYTES_PER_TOKEN, 25.0, BYTES_PER_TOKEN) if offload else None
    spec = AllocatorSpec("paged", block_size=B)
    wl = Workload("hand", "", 0, "serve", 3, PoolSpec(80), (spec,), sched, timing, make, offload=tier)
    return wl, spec


def ttft_ps(result, i: int) -> int:
    return round((result.requests.columns["first_token"][i] - result.requests.columns["arrival"][i]) * 1e12)


def test_a_prefix_evicted_from_the_gpu_loads_from_the_tier_by_hand():
    """C finds A's head block on the GPU (16 tokens) and A's three other blocks in the tier (48):
    the whole prompt, so its last token is recomputed. The load is 3 blocks x 83,886,080 ps, then one
    step computes 1 token over 63 held: TTFT = 251,658,240 + 1,000,000 + 63 x 1,000 ps."""
    wl, spec = three_requests(cpu_blocks=8)
    result = assert_agree(wl, spec, 64)
    o = result.offload
    assert (o["query_tokens"], o["hit_tokens"], o["loads"], o["tokens_loaded"]) == (64 + 64 + 48, 48, 1, 48)
    assert o["bytes_loaded"] == 3 * B * BYTES_PER_TOKEN == 6_291_456
    assert o["load_time_s"] == 3 * LOAD_PS / 1e12
    assert o["hit_rate"] == 48 / 176 and o["combined_hit_rate"] == (16 + 48) / 192
    assert (o["blocks_stored"], o["blocks_evicted"], o["cpu_blocks"]) == (8, 0, 8)
    assert result.prefix.hit_tokens == 16  # the GPU cache's own hit rate is unchanged
    assert ttft_ps(result, 2) == 3 * LOAD_PS + STEP_PS + 63 * 1000
    without = assert_agree(*three_requests(cpu_blocks=8, offload=False), 64)
    assert ttft_ps(without, 2) == STEP_PS + 16 * 1000  # 48 tokens computed over A's head block


def test_the_tier_evicts_least_recently_used_tail_first_by_hand():
    """A tier of 7 blocks: B's store evicts one block, A's tail (A's prefix was touched head last,
    so its tail is the least recent). C loads A's blocks 2 and 3 (32 tokens) and computes block 4:
    TTFT = 2 x 83,886,080 + 1,000,000 + 48 x 1,000 ps; storing block 4 then evicts B's tail."""
    wl, spec = three_requests(cpu_blocks=7)
    result = assert_agree(wl, spec, 64)
    o = result.offload
    assert (o["hit_tokens"], o["tokens_loaded"], o["blocks_stored"], o["blocks_evicted"]) == (32, 32, 9, 2)
    assert ttft_ps(result, 2) == 2 * LOAD_PS + STEP_PS + 48 * 1000


def test_a_tier_that_holds_no_block_is_refused():
    wl, spec = three_requests(cpu_blocks=1)
    with pytest.raises(WorkloadError, match="hold no CPU block"):
        simulate(replace(wl, offload=replace(wl.offload, cpu_bytes=B * BYTES_PER_TOKEN - 1)), spec)


# -- without a tier nothing changes; the same seed gives the same bytes ---------------------------


@pytest.mark.parametrize("seed", range(12))
def test_a_run_without_its_tier_is_the_run_without_offload(seed):
    """Breaks if the tier's code touches a run that has none: an allocator with offload: false (the
    "no-offload" companion run) gives the bytes of the same workload with no `offload:` at all."""
    wl, spec, points = random_offload_workload(seed, big=seed % 2 == 1)
    off = simulate(wl, replace(spec, offload=False), record_requests=True, timeline_points=points)
    plain = simulate(replace(wl, offload=None), spec, record_requests=True, timeline_points=points)
    assert off.label == plain.label + " no-offload"
    assert as_json(replace(off, label=plain.label)) == as_json(plain)
    assert "offload" not in plain.to_dict()


def test_the_tier_state_is_conserved():
    """At the end every GPU block is back and no tier block is still pinned by a load."""
    for seed in range(30):
        wl, spec, _ = random_offload_workload(seed, big=True)
        try:
            setup, state = run_to_end(wl, spec)
        except WorkloadError:
            continue
        st = state.st
        assert st[K.FREE_BLOCKS] == setup.num_blocks and st[K.SHARED] == 0
        assert st[K.LD_LEN] == st[K.CPU_PINNED] == st[K.LD_TOKENS] == st[K.LD_BLOCKS] == 0
        assert st[K.CPU_USED] <= setup.offload.num_blocks
        assert np.all(state.cpu[K.C_REF:int(st[K.CPU_USED]) * K.NS:K.NS] == 0)


# -- a multi-turn workload from a file, in serve and in a fleet ------------------------------------

MULTITURN = """name: multiturn-offload
model: meta-llama/Llama-3.1-8B-Instruct
gpu: H100-80GB
pool: {kv_memory: 3GiB}
requests:
  count: 300
  prompt: {dist: uniform, low: 200, high: 600}
  output: {dist: uniform, low: 50, high: 200}
  arrival: {process: poisson, rate: 4}
prefix: {system_prompts: 1, system_prompt_len: 1000, turns: 10, sessions: 40}
scheduler: {max_model_len: 12000}
offload: {kv_offloading_size: 8GiB, gb_per_s: 25}
"""


@pytest.fixture(scope="module")
def multiturn(tmp_path_factory):
    path = tmp_path_factory.mktemp("offload") / "multiturn.yaml"
    path.write_text(MULTITURN, encoding="utf-8")
    return path


def test_the_tier_raises_the_hit_rate_of_a_multi_turn_workload(multiturn):
    """40 conversations of 10 turns outgrow a 3 GiB GPU cache; an 8 GiB tier keeps them: its hits
    come on top of the GPU's, and prefills get shorter (TTFT falls)."""
    from kvplan.experiments import load
    from kvplan.sim.engine import serve_document

    doc = serve_document(load(multiturn))
    tier, gpu_only = doc["results"][0], doc["results"][1]
    assert [r["label"] for r in doc["results"]] == ["paged-B16", "paged-B16 no-offload", "paged-B16 no-cache"]
    assert tier["offload"]["hit_rate"] > 0.2
    assert tier["offload"]["combined_hit_rate"] > gpu_only["prefix_cache"]["prefix_hit_rate"] + 0.1
    assert tier["ttft_s"]["mean"] < gpu_only["ttft_s"]["mean"]
    assert "offload" not in gpu_only


def test_same_seed_same_bytes_and_the_cli_prints_the_tier(multiturn, run_cli):
    """Two runs of the file print the same JSON; the text output has the tier's table."""
    outs = [run_cli("simulate", str(multiturn), *extra) for extra in (["--json"], ["--json"], [])]
    assert [code for code, _, _ in outs] == [0, 0, 0]
    assert outs[0][1] == outs[1][1] and '"offload"' in outs[0][1]
    assert "CPU offload tier" in outs[2][1] and "GPU+CPU hit %" in outs[2][1]


def test_a_fleet_keeps_a_tier_per_replica(multiturn, tmp_path):
    """A fleet of one is the serve run with its tier to the byte; two replicas have a tier each and
    the fleet sums them."""
    from kvplan.experiments import load
    from kvplan.fleet.run import simulate_fleet

    serve = load(multiturn)
    alone = simulate(serve, serve.allocators[0]).to_dict()
    for count in (1, 2):
        path = tmp_path / f"fleet{count}.yaml"
        path.write_text(MULTITURN.replace("name: multiturn-offload", "experiment: fleet")
                        + f"replicas: [{{count: {count}}}]\nrouter: round_robin\n", encoding="utf-8")
        doc = simulate_fleet(load(path)).to_dict()
        rows = [{k: v for k, v in r.items() if k not in ("replica", "group", "role", "routed", "busy_s")}
                for r in doc["replicas"]]
        if count == 1:
            assert rows[0] == alone
        assert all(r["offload"]["loads"] > 0 for r in rows)
        assert doc["fleet"]["offload"]["bytes_loaded"] == sum(r["offload"]["bytes_loaded"] for r in rows)
