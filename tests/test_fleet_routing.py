"""Routers as deployed: ties broken by a seeded random choice (not the lowest index), and the
KV-balance router no worse than random when replicas preempt."""

from __future__ import annotations

import pytest

from kvplan.experiments import load
from kvplan.fleet.run import simulate_fleet
from tests.test_fleet import fleet_file

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _fleet(tmp_path, router: str, *, count: int, prompt: str, output: str, rate: float, replicas: int,
           seed: int = 0, gpu: str = "L40S", extra: str = "", name: str = "fleet.yaml"):
    path = tmp_path / name
    path.write_text(f"name: fleet\nexperiment: fleet\nseed: {seed}\nmodel: {MODEL}\ngpu: {gpu}\n"
                    "pool: {gpu_memory_utilization: 0.9}\nscheduler: {max_model_len: 16384}\n"
                    f"requests:\n  count: {count}\n  prompt: {prompt}\n  output: {output}\n"
                    f"  arrival: {{process: poisson, rate: {rate}}}\nreplicas:\n  - {{count: {replicas}}}\n"
                    f"router: {router}\n{extra}")
    return load(path)


LOOKING = ("least_outstanding", "least_kv", "prefix_aware")


@pytest.mark.parametrize("router", LOOKING)
def test_an_idle_fleet_spreads_its_requests(tmp_path, router):
    """400 short requests, one every 2 s on average, over 8 replicas: each finds every replica
    idle, so every replica ties. A seeded random choice gives each about 400 / 8 = 50 (binomial,
    sd 6.6: 25 to 75 is beyond 3.7 sd); ties to the lowest index gave [241, 92, 40, 25 ...]."""
    wl = _fleet(tmp_path, f"{{policy: {router}, sync_interval_s: 0.1}}", count=400,
                prompt="{dist: fixed, value: 200}", output="{dist: fixed, value: 20}", rate=0.5, replicas=8)
    routed = simulate_fleet(wl).routed
    assert sum(routed) == 400
    assert all(25 <= n <= 75 for n in routed), routed


@pytest.mark.parametrize("router", LOOKING)
def test_the_tie_break_is_seeded(tmp_path, router):
    """The same file routes the same way every run; another seed draws other ties."""
    args = dict(count=200, prompt="{dist: fixed, value: 200}", output="{dist: fixed, value: 20}", rate=0.5,
                replicas=8)
    a = simulate_fleet(_fleet(tmp_path, router, name="a.yaml", **args)).to_dict()
    b = simulate_fleet(_fleet(tmp_path, router, name="b.yaml", **args)).to_dict()
    c = simulate_fleet(_fleet(tmp_path, router, name="c.yaml", seed=1, **args)).to_dict()
    assert a == b
    assert [r["routed"] for r in a["replicas"]] != [r["routed"] for r in c["replicas"]]


def test_least_kv_is_no_worse_than_random_when_replicas_preempt(tmp_path):
    """Long prompts and outputs near the 4 replicas' KV capacity: random routing overfills some
    replicas, which preempt; least_kv's view of KV in use (a preempting replica has just freed
    blocks) must not feed on itself into more preemption than random's."""
    args = dict(count=1500, prompt="{dist: lognormal, mean: 3000, sigma: 0.8}",
                output="{dist: lognormal, mean: 800, sigma: 0.8}", rate=2.6, replicas=4, seed=3)
    rand = simulate_fleet(_fleet(tmp_path, "random", name="r.yaml", **args))
    kv = simulate_fleet(_fleet(tmp_path, "least_kv", name="k.yaml", **args))
    preempted = [sum(r.preemptions for r in x.replicas) for x in (rand, kv)]
    assert preempted[0] > 0  # the case does preempt
    assert preempted[1] <= preempted[0]
    assert kv.ttft.p99 <= rand.ttft.p99 and kv.e2e.p99 <= rand.e2e.p99


# ---- llm-d's scheduler and SGLang's cache-aware router -------------------------------------------

PREFIXED = dict(count=1500, prompt="{dist: fixed, value: 1600}", output="{dist: fixed, value: 40}", rate=16,
                replicas=4, extra="prefix: {system_prompts: 300, system_prompt_len: 1536, hash_block_size: 16, "
                                  "popularity: uniform}\n")


@pytest.mark.parametrize("router", ["{policy: llm_d}", "{policy: llm_d, index: precise}",
                                    "{policy: llm_d, index: precise, prefix_score: min_max}", "sglang"])
def test_the_deployed_prefix_routers_keep_the_hits_random_scatters(tmp_path, router):
    """300 shared 1,536-token system prompts (460,800 tokens) over 4 L40S replicas of 197,093 KV
    slots each: no replica holds them all, the fleet does. Random sends each prompt everywhere,
    so each replica's cache churns; the prefix-aware routers keep a prompt on few replicas, so
    more of the prompt tokens are found cached and the TTFT falls."""
    rand = simulate_fleet(_fleet(tmp_path, "random", name="r.yaml", **PREFIXED))
    aware = simulate_fleet(_fleet(tmp_path, router, name="a.yaml", **PREFIXED))
    assert aware.prefix_hit_rate > 1.5 * rand.prefix_hit_rate
    assert aware.ttft.p90 < rand.ttft.p90


def test_llm_d_without_its_prefix_scorer_balances_the_queues(tmp_path):
    """prefix_weight 0 is llm-d's load-scheduling (queue + KV utilization): on unshared prompts at
    a load that queues, its routed counts stay within 10% of the mean."""
    wl = _fleet(tmp_path, "{policy: llm_d, prefix_weight: 0}", count=1200, prompt="{dist: fixed, value: 2000}",
                output="{dist: fixed, value: 100}", rate=30, replicas=4)
    routed = simulate_fleet(wl).routed
    assert max(routed) <= 1.1 * 300 and min(routed) >= 0.9 * 300, routed


def _replica(n_blocks=1000, block=16, waiting=0, used=0, cached=0, outstanding=0):
    from types import SimpleNamespace

    return SimpleNamespace(setup=SimpleNamespace(num_blocks=n_blocks, block_size=block), waiting=waiting,
                           blocks_used=used, outstanding=outstanding, cached_hash_blocks=lambda ids, c=cached: c)


def _chunk(ids, prompt, size=16):
    import numpy as np

    from kvplan.workload.chunks import RequestChunk

    return RequestChunk(np.zeros(1), np.array([prompt]), np.array([10]), hash_ids=[ids], hash_block_size=size)


def test_llm_d_scores_by_hand():
    """Two replicas; the precise index says replica 0 holds 10 of the prompt's 20 blocks and
    replica 1 none. Ratio scores: 0: 2 x 0.5 + (1 - 0.9) + queue 0 (it waits 3, the other 1) = 1.1;
    1: 0 + (1 - 0.1) + 1 = 1.9, so replica 1. With min_max, replica 0's prefix score is 1: 2.1
    against 1.9, so replica 0."""
    from kvplan.fleet.routers import make_router
    from kvplan.workload.routing import RouterSpec

    reps = [_replica(used=900, waiting=3, cached=10), _replica(used=100, waiting=1, cached=0)]
    ids, prompt = list(range(20)), 320
    for score, want in (("ratio", 1), ("min_max", 0)):
        router = make_router(RouterSpec("llm_d", index="precise", prefix_score=score), reps, 0)
        router.sync()
        assert router.assign(_chunk(ids, prompt)).tolist() == [want], score


def test_precise_min_max_scales_only_the_holders_by_hand():
    """llm-d's precise scorer before May 2026 min-max scales the pods that hold the prompt's first
    block among themselves, every other pod 0 (its index scores only those pods). Three replicas
    hold 20, 18 and 0 of the prompt's 20 blocks, queues all empty (queue score 1 each), KV in use
    0.5, 0.1 and 0.9. Over the holders: prefix [1, 0, 0], so 2 x 1 + 0.5 + 1 = 3.5, 0 + 0.9 + 1 =
    1.9 and 0 + 0.1 + 1 = 1.1: replica 0, whose cache holds the whole prompt. Scaled over every
    replica instead, replica 1's 18 blocks would score 0.9: 1.8 + 0.9 + 1 = 3.7, replica 1. With
    a single holder it scores 1 and the others 0, as before; with none, all score alike."""
    from kvplan.fleet.routers import _min_max_of_holders, make_router
    from kvplan.workload.routing import RouterSpec

    reps = [_replica(used=500, cached=20), _replica(used=100, cached=18), _replica(used=900, cached=0)]
    router = make_router(RouterSpec("llm_d", index="precise", prefix_score="min_max"), reps, 0)
    router.sync()
    assert router.assign(_chunk(list(range(20)), 320)).tolist() == [0]
    assert _min_max_of_holders([20, 18, 0]) == [1.0, 0.0, 0.0]
    assert _min_max_of_holders([0, 7, 0]) == [0.0, 1.0, 0.0]
    assert _min_max_of_holders([5, 5, 0]) == [1.0, 1.0, 0.0]
    assert _min_max_of_holders([0, 0, 0]) == [0.0, 0.0, 0.0]
    assert _min_max_of_holders([10, 15, 20]) == [0.0, 0.5, 1.0]


def test_sglang_routes_by_match_then_by_load_by_hand():
    """SGLang's cache-aware rule: a prompt sent once goes back to its replica while the match
    covers more than cache_threshold of it; a prompt matching too little, or loads imbalanced by
    more than 64 requests and 1.5x, goes to the least loaded."""
    from kvplan.fleet.routers import make_router
    from kvplan.workload.routing import RouterSpec

    reps = [_replica(outstanding=5), _replica(outstanding=2)]
    router = make_router(RouterSpec("sglang"), reps, 0)
    router.sync()
    first = router.assign(_chunk(list(range(20)), 320)).tolist()
    assert first == [1]  # nothing matched: the least loaded
    router.load = [2, 5]  # now replica 1 is the busier one
    assert router.assign(_chunk(list(range(20)), 320)).tolist() == [1]  # 100% match beats the load
    assert router.assign(_chunk(list(range(5)) + list(range(100, 115)), 320)).tolist() == [0]  # 25% < 0.3
    router.load = [1, 100]  # imbalanced: 99 > 64 and 100 > 1.5
    assert router.assign(_chunk(list(range(20)), 320)).tolist() == [0]


TEN = ("  count: 10\n  prompt: {dist: fixed, value: 100}\n  output: {dist: fixed, value: 10}\n"
       "  arrival: {process: poisson, rate: 1}\n")


def test_a_router_key_of_another_policy_is_one_line(tmp_path, run_cli):
    path = fleet_file(tmp_path, TEN, replicas="  - {count: 2}\n", router="{policy: sglang, index: precise}")
    code, out, err = run_cli("simulate", str(path))
    assert code == 2 and "router.index" in err and "llm_d" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("router, field, says", [
    ("{policy: llm_d, lru_capacity_blocks: 0}", "router.lru_capacity_blocks", "integer >= 1"),
    ("{policy: llm_d, lru_capacity_blocks: 2.5}", "router.lru_capacity_blocks", "integer"),
    ("{policy: llm_d, active_request_weight: -1}", "router.active_request_weight", ">= 0"),
    ("{policy: random, lru_capacity_blocks: 10}", "router.lru_capacity_blocks", "llm_d"),
    ("{policy: llm_d, index: precise, lru_capacity_blocks: 10}", "router.lru_capacity_blocks", "approximate index"),
])
def test_llm_d_lru_capacity_and_active_request_weight_refused_in_one_line(tmp_path, run_cli, router, field, says):
    path = fleet_file(tmp_path, TEN, replicas="  - {count: 2}\n", router=router)
    code, out, err = run_cli("simulate", str(path))
    assert code == 2 and field in err and says in err and len(err.strip().splitlines()) == 1, err


# ---- the gateway in front of a router ---------------------------------------------------------------

GATED = dict(count=300, prompt="{dist: fixed, value: 1000}", output="{dist: fixed, value: 20}", rate=4, replicas=2)


def test_a_gateway_adds_its_latency_to_every_request_and_nothing_else(tmp_path):
    """A gateway of 40 ms in front of round robin: the request crosses it before any replica sees
    it, a constant shift of every arrival, so each request's TTFT and E2E gain exactly 40 ms (by
    hand: its percentiles too), its TPOT and the replicas' own runs are unchanged."""
    import numpy as np

    extra = "slo: {ttft_s: 10}\n"
    plain = simulate_fleet(_fleet(tmp_path, "round_robin", name="p.yaml", extra=extra, **GATED), record=True)
    gated = simulate_fleet(_fleet(tmp_path, "{policy: round_robin, gateway_s: 0.04}", name="g.yaml", extra=extra,
                                  **GATED), record=True)
    for key in ("ttft_s", "e2e_s"):
        assert np.allclose(gated.requests[key] - plain.requests[key], 0.04, atol=1e-6), key
    assert np.array_equal(gated.requests["tpot_s"], plain.requests["tpot_s"], equal_nan=True)
    assert abs(gated.ttft.p90 - plain.ttft.p90 - 0.04) < 1e-6 and abs(gated.e2e.p50 - plain.e2e.p50 - 0.04) < 1e-6
    assert [r.to_dict() for r in gated.replicas] == [r.to_dict() for r in plain.replicas]
    assert gated.to_dict()["router"]["gateway_s"] == 0.04 and plain.to_dict()["router"]["gateway_s"] == 0.0


def test_goodput_counts_the_gateway(tmp_path):
    """With a TTFT limit between a request's TTFT and its TTFT + the gateway's latency, the fleet's
    goodput counts the request out: the limit set 10 ms above the slowest TTFT without a gateway
    keeps every request in; behind a 50 ms gateway, only those 40 ms or more under it stay."""
    import numpy as np

    plain = simulate_fleet(_fleet(tmp_path, "round_robin", name="p.yaml", **GATED), record=True)
    ttft = plain.requests["ttft_s"]
    limit = float(ttft.max()) + 0.01
    extra = f"slo: {{ttft_s: {limit}}}\n"
    free = simulate_fleet(_fleet(tmp_path, "round_robin", name="f.yaml", extra=extra, **GATED))
    gated = simulate_fleet(_fleet(tmp_path, "{policy: round_robin, gateway_s: 0.05}", name="g.yaml", extra=extra,
                                  **GATED))
    assert free.goodput["requests"] == len(ttft)
    assert gated.goodput["requests"] == int(np.sum(ttft + 0.05 <= limit)) < len(ttft)


def test_llm_d_runs_behind_its_gateway_by_default():
    """llm-d's scheduler is an endpoint picker behind Envoy: 8.19 + 6.13 + 10.94 ms of the EPP's own
    timings (llm-d/llm-d-router#1109) = 25.3 ms, 25 ms; the other policies have none unless set."""
    from kvplan.workload.routing import RouterSpec

    assert RouterSpec("llm_d").gateway_latency_s == 0.025
    assert RouterSpec("random").gateway_latency_s == 0.0
    assert RouterSpec("random", gateway_s=0.1).gateway_latency_s == 0.1
    assert RouterSpec("llm_d", gateway_s=0).gateway_latency_s == 0.0


def test_llm_d_approximate_index_matches_256_blocks_of_the_pods_block_size():
    """llm-d's approximate prefix plugin hashes at most 256 blocks of 4 x the pod's reported block
    size in characters (~ the block size in tokens). A prompt of 100 blocks of 64 tokens sent to
    replica 1, then one sharing its first 80 blocks: pods of 64-token blocks match up to 256 x 64 =
    16,384 tokens, so all 100 blocks are looked at and replica 1 scores 80 / 100 = 0.8; pods of
    vLLM's 16-token blocks stop at 4,096 tokens = 64 blocks of the stream, all shared: 64 / 64 = 1."""
    from kvplan.fleet.routers import make_router
    from kvplan.workload.routing import RouterSpec

    first, second = list(range(100)), list(range(80)) + list(range(200, 220))
    for block, want in ((64, 0.8), (16, 1.0)):
        reps = [_replica(block=block, used=900, waiting=3), _replica(block=block, used=0, waiting=0)]
        router = make_router(RouterSpec("llm_d"), reps, 0)
        router.sync()
        assert router.assign(_chunk(first, 6400, size=64)).tolist() == [1]  # the idle one
        scores, _ = router._prefix(second, 6400, 64)
        assert scores == [0.0, want], block
    assert make_router(RouterSpec("llm_d", max_prefix_tokens=640), reps, 0).max_prefix == 640


def test_llm_d_approximate_index_forgets_past_its_lru_capacity_by_hand():
    """lruCapacityPerServer: replica 1 (idle, so every prompt goes there) remembers 4 blocks of its
    16-token blocks. Prompt A (blocks 0-3) fills its index; prompt B (blocks 10-13) pushes A's four
    blocks out, so A scores 0 there and B 1. With the default capacity (the replica's 1,000 KV
    blocks) A is still held: 1."""
    from kvplan.fleet.routers import make_router
    from kvplan.workload.routing import RouterSpec

    a, b = [0, 1, 2, 3], [10, 11, 12, 13]
    for capacity, want in ((4, 0.0), (None, 1.0)):
        reps = [_replica(used=900, waiting=3), _replica(used=0, waiting=0)]
        router = make_router(RouterSpec("llm_d", lru_capacity_blocks=capacity), reps, 0)
        router.sync()
        assert router.assign(_chunk(a, 64)).tolist() == [1]
        assert router.assign(_chunk(b, 64)).tolist() == [1]
        assert router._prefix(a, 64, 16)[0] == [0.0, want], capacity
        assert router._prefix(b, 64, 16)[0] == [0.0, 1.0], capacity


def test_llm_d_active_request_scorer_counts_its_own_picks_by_hand():
    """active-request-scorer alone (queue and KV weights 0, no prefix): replicas serving 0 and 2
    requests at the refresh score 1 (idle) and 0 ((2 - 2) / 2): replica 0. It has 1 now and scores
    (2 - 1) / 2 = 0.5 against 0: replica 0 again; then both have 2, both score 0, and the seeded
    tie-break picks either. The queue scorer, read from the refresh alone, would score them 1 and 1
    at every pick (no one waits)."""
    from kvplan.fleet.routers import make_router
    from kvplan.workload.routing import RouterSpec

    reps = [_replica(outstanding=0), _replica(outstanding=2)]
    router = make_router(RouterSpec("llm_d", queue_weight=0, kv_cache_weight=0, prefix_weight=0,
                                    active_request_weight=1), reps, 0)
    router.sync()
    assert router.assign(_chunk(list(range(4)), 64)).tolist() == [0]
    assert router.assign(_chunk(list(range(4)), 64)).tolist() == [0]
    assert router.active == [2, 2]


def test_vllm_dp_balances_by_waiting_and_running_by_hand():
    """vLLM's DP balancer, three ranks published as (waiting, running) = (1, 2), (0, 5), (0, 6):
    scores 1 x 4 + 2 = 6, 5, 6. Five requests in one refresh interval, each pick adding a waiting
    request to its rank: rank 1 (5; then 9), rank 0 (6, first of the tie 6, 6; then 10), rank 2
    (6; then 10), rank 1 (9; then 13), rank 0 (10, first of the tie with rank 2; then 14). A new
    publication resets the counts to the ranks' own."""
    import numpy as np

    from kvplan.fleet.routers import make_router
    from kvplan.workload.chunks import RequestChunk
    from kvplan.workload.routing import RouterSpec

    reps = [_replica(waiting=1, outstanding=3), _replica(waiting=0, outstanding=5),
            _replica(waiting=0, outstanding=6)]
    router = make_router(RouterSpec("vllm_dp"), reps, 0)
    router.sync()
    chunk = RequestChunk(np.zeros(5), np.full(5, 100), np.full(5, 10))
    assert router.assign(chunk).tolist() == [1, 0, 2, 1, 0]
    router.sync()
    assert router.assign(chunk.take(slice(0, 1))).tolist() == [1]


def test_vllm_dp_sends_an_idle_fleets_requests_to_the_first_rank(tmp_path):
    """Unlike the seeded tie-break of the other routers, vLLM's balancer takes the first of tied
    ranks: requests 20 s apart (gamma gaps of cv 0.001: each done long before the next) all find
    every rank idle, so all go to rank 0, as vLLM's DPLBAsyncMPClient sends them; the same file
    with the requests 1 s apart and 3 s long (200 output tokens) finds rank 0 busy, and spreads."""
    def routed(rate, output):
        path = tmp_path / f"dp-{rate}.yaml"
        path.write_text(f"name: dp\nexperiment: fleet\nseed: 0\nmodel: {MODEL}\ngpu: L40S\n"
                        "pool: {gpu_memory_utilization: 0.9}\nrequests:\n  count: 30\n  prompt: {dist: fixed, value: 200}\n"
                        f"  output: {{dist: fixed, value: {output}}}\n"
                        f"  arrival: {{process: gamma, rate: {rate}, cv: 0.001}}\n"
                        "replicas:\n  - {count: 4}\nrouter: vllm_dp\n")
        return simulate_fleet(load(path)).routed

    assert routed(0.05, 20) == [30, 0, 0, 0]
    assert min(routed(1.0, 200)) > 0


@pytest.mark.parametrize("seed", range(12))
def test_prefix_aware_picks_the_cheapest_by_dynamos_cost_as_written(seed):
    """The router finds Dynamo's cheapest replica without computing every replica's cost; each
    pick must still be the definition's: of the costs w x max(p - depth x 16, 0) + held, depth
    the leading blocks of the prompt sent to the replica before (counted here from a plain set of
    the prefixes it was sent) and held its KV tokens plus the prompts sent since the refresh, the
    least, ties broken by the same uniform draw over the tied replicas in index order."""
    import numpy as np

    from kvplan.fleet.routers import make_router
    from kvplan.workload.chunks import RequestChunk
    from kvplan.workload.routing import RouterSpec

    rng = np.random.default_rng(seed)
    n, size, count = int(rng.integers(2, 9)), 16, 300
    w = float(rng.choice([0.0, 0.5, 1.0, 3.0]))
    used = rng.integers(0, 3, size=n) * 4  # few distinct loads, so ties are common
    reps = [_replica(n_blocks=10**6, used=int(u)) for u in used]
    heads = [list(rng.integers(0, 1000, size=8)) for _ in range(5)]  # shared leading blocks
    ids, prompts = [], []
    for _ in range(count):
        head = heads[int(rng.integers(0, 5))][:int(rng.integers(0, 9))]
        tail = list(rng.integers(1000, 2000, size=int(rng.integers(0, 4))))
        ids.append(head + tail)
        prompts.append(16 * len(ids[-1]) + int(rng.integers(0, 16)) if ids[-1] else int(rng.integers(1, 16)))
    chunk = RequestChunk(np.zeros(count), np.array(prompts), np.full(count, 10), hash_ids=ids, hash_block_size=size)
    router = make_router(RouterSpec("prefix_aware", overlap_weight=w), reps, seed)
    router.sync()
    got = router.assign(chunk).tolist()

    draws = np.random.default_rng([seed, 0x71E5]).random(count).tolist()  # the router's tie draws
    held = [int(u) * 16 for u in used]
    sent = [set() for _ in range(n)]
    for i, (prompt, blocks) in enumerate(zip(prompts, ids)):
        blocks = blocks[:prompt // size]
        depth = [max([k for k in range(len(blocks) + 1) if tuple(blocks[:k]) in sent[r]], default=0) for r in range(n)]
        costs = [w * max(prompt - d * size, 0) + h for d, h in zip(depth, held)]
        tied = [r for r, c in enumerate(costs) if c == min(costs)]
        want = tied[int(draws[i] * len(tied))] if len(tied) > 1 else tied[0]
        assert got[i] == want, (i, costs)
        held[want] += prompt
        sent[want].update(tuple(blocks[:k]) for k in range(1, len(blocks) + 1))
