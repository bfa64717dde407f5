"""SGLang's scheduler (`engine: sglang`, kvplan/sim/sglang.py): the compiled kernel against the
step-by-step reference on random workloads, the tree's conservation, and hand-counted cases whose
every number is derived in the comments from the rules in kvplan/sim/sglang.py's docstring."""

from __future__ import annotations

import numpy as np
import pytest

from kvplan.model.layout import KVLayout, LayerGroup
from kvplan.sim.engine import simulate
from kvplan.sim.sglang import new_token_ratios
from kvplan.sim.sglang_reference import sglang_reference, simulate_sglang_reference
from kvplan.workload.records import (AllocatorSpec, PoolSpec, RequestChunk, SchedulerConfig, SglangConfig,
                                     TimingConfig, Workload)
from tests.test_sim_engine import as_json, random_timing
from tests.test_sim_prefix_serve import shared_prompts

SPEC = AllocatorSpec("paged", block_size=16)  # the default allocator: SGLang's pool ignores it


def random_sglang_workload(seed: int, big: bool = False):
    rng = np.random.default_rng([seed, 31, int(big)])
    hash_block = int(rng.choice([1, 2, 4, 8, 16]))
    mml = hash_block * 10 + int(rng.integers(1, 40))
    n = int(rng.integers(40, 220) if big else rng.integers(2, 50))
    prompt, ids = shared_prompts(rng, n, hash_block, mml)
    output = np.maximum(np.minimum(rng.integers(0, 80 if big else 30, n), mml - prompt), 0)
    arrival = np.cumsum(rng.exponential(rng.choice([0.2, 2, 10]), n))
    if rng.random() < 0.2:
        arrival[:] = 0.0
    timed = bool(rng.random() < 0.5)
    if timed:
        arrival *= float(rng.choice([1e-7, 1e-5]))
    sched = SchedulerConfig(8, 8192, mml, True, "recompute", 0, False, True)
    slots = int(rng.integers(mml + 1, 4 * mml + 2))
    timing = random_timing(rng, timed)
    chunk = int(rng.choice([0, int(rng.integers(1, mml + 1))]))
    g = SglangConfig(schedule_policy=str(rng.choice(["lpm", "lpm", "fcfs"])),
                     schedule_conservativeness=float(rng.choice([0.3, 1.0, 1.0, 2.0])),
                     chunked_prefill_size=chunk, max_prefill_tokens=int(rng.integers(1, 2 * mml)),
                     max_running_requests=int(rng.integers(1, 40 if big else 10)),
                     radix_cache=bool(rng.random() < 0.85))
    size = int(rng.integers(1, n + 1))

    def make():
        for s in range(0, n, size):
            yield RequestChunk(arrival[s:s + size], prompt[s:s + size], output[s:s + size],
                               ids[s:s + size], hash_block)

    wl = Workload("random-sglang", "", seed, "serve", n, PoolSpec(slots), (SPEC,), sched, timing, make, sglang=g,
                  layout=windowed_layout(np.random.default_rng([seed, 32, int(big)]), mml))
    return wl, int(rng.choice([4, 8, 64, 2048]))


def windowed_layout(rng, mml: int):
    """A layout with sliding-window layers (a window within the requests' lengths) for 40% of the
    random workloads, else None: their steps read the window's KV (SimSetup.reads)."""
    if rng.random() >= 0.4:
        return None
    groups = (LayerGroup("full", int(rng.integers(0, 4)), 1, 8, 8),
              LayerGroup("sliding", int(rng.integers(1, 6)), 1, 8, 8, window=int(rng.integers(1, mml + 1))))
    return KVLayout("windowed", "auto", 1, groups, None)


def assert_agree(wl, points: int) -> None:
    fast = simulate(wl, SPEC, record_requests=True, timeline_points=points)
    slow = simulate_sglang_reference(wl, SPEC, record_requests=True, timeline_points=points)
    assert as_json(fast) == as_json(slow)


@pytest.mark.parametrize("seed", range(300))
def test_kernel_equals_reference_on_random_workloads(seed):
    """Breaks if an admission, a retraction, the lpm order, a match, an insertion or an eviction
    of the compiled kernel differs from the plain reference."""
    assert_agree(*random_sglang_workload(seed))


@pytest.mark.parametrize("seed", range(30))
def test_kernel_equals_reference_on_larger_random_workloads(seed):
    assert_agree(*random_sglang_workload(seed, big=True))


def test_random_workloads_exercise_every_rule():
    """The random cases hit, evict, retract, chunk, reorder and demote (else they would prove little)."""
    counts = dict.fromkeys(("hit", "evicted", "retracted", "chunked", "reordered", "demoted"), 0)
    for seed in range(80):
        wl, _ = random_sglang_workload(seed, big=seed % 2 == 1)
        sim, _, _ = sglang_reference(wl, SPEC)
        sim.run()
        for key, value in (("hit", sim.stats["hit"]), ("evicted", sim.stats["evicted"]),
                           ("retracted", sim.preemptions), ("chunked", sim.chunks),
                           ("reordered", sim.reorders), ("demoted", sim.demotions)):
            counts[key] += value > 0
    assert min(counts.values()) >= 5, counts


@pytest.mark.parametrize("seed", range(40))
def test_tree_conservation(seed):
    """At the end every token is free or in the tree, nothing is locked, and the evictable leaves
    are exactly the cached nodes without cached children."""
    wl, _ = random_sglang_workload(seed, big=seed % 2 == 1)
    sim, _, _ = sglang_reference(wl, SPEC)
    sim.run()
    cached = [n for n, c in enumerate(sim.cached) if c]
    assert sim.free + len(cached) * sim.H == sim.s.slots
    assert sum(sim.lock) == 0 and sim.evictable == len(cached) * sim.H
    assert sim.leaves == {n for n in cached if sim.kids[n] == 0}
    assert all(r.done and r.generated == r.output for r in sim.reqs)


# -- hand-counted cases ----------------------------------------------------------------------------


def hand_workload(requests, slots, g: SglangConfig, *, mml=64, hash_block=4, timing=None):
    """(arrival step, prompt, output, hash ids) per request, arrivals in steps."""
    arrival = np.array([r[0] for r in requests], dtype=np.float64)
    prompt = np.array([r[1] for r in requests], dtype=np.int64)
    output = np.array([r[2] for r in requests], dtype=np.int64)
    ids = [tuple(r[3]) for r in requests]

    def make():
        yield RequestChunk(arrival, prompt, output, ids, hash_block)

    sched = SchedulerConfig(64, 8192, mml, True, "recompute", 0, False, True)
    return Workload("hand", "", 0, "serve", len(requests), PoolSpec(slots), (SPEC,), sched,
                    timing or TimingConfig(), make, sglang=g)


RUNNERS = {"kernel": simulate, "reference": simulate_sglang_reference}


def records(result) -> dict[str, list]:
    return {k: v.tolist() for k, v in result.requests.columns.items()}


@pytest.mark.parametrize("run", RUNNERS)
def test_a_shared_prefix_is_matched_to_the_token(run):
    """Breaks if the match is block-granular, leaves no token to compute, or prefill and decode
    share a step. Hash blocks of 4 tokens; A (prompt 8, blocks x y; output 2) arrives at 0, B
    (prompt 8, the same blocks x y; output 2) at 2. Step 0: A prefills 8 (first token at 1) and
    its blocks x, y join the tree. Step 1: A decodes its 2nd token and finishes at 2. Step 2: B
    matches x y, 8 tokens, at most prompt - 1 = 7: it prefills 1 token (first token at 3). Step 3:
    B decodes and finishes at 4. vLLM with 16-token blocks would hit nothing of these 8 tokens."""
    g = SglangConfig(chunked_prefill_size=0)
    wl = hand_workload([(0, 8, 2, (1, 2)), (2, 8, 2, (1, 2))], 100, g)
    r = RUNNERS[run](wl, SPEC, record_requests=True)
    rec = records(r)
    assert rec["cached_tokens"] == [0, 7]
    assert rec["first_token"] == [1.0, 3.0] and rec["finish"] == [2.0, 4.0]
    assert r.steps == 4
    assert r.to_dict()["prefix_cache"]["hit_tokens"] == 7


@pytest.mark.parametrize("run", RUNNERS)
def test_lpm_serves_the_longest_match_first_and_fcfs_in_order(run):
    """Breaks if lpm does not sort by cached tokens or fcfs does. One request at a time
    (max_running_requests 1). A (prompt 12, blocks a b c, output 1) arrives at 0 and runs alone in
    step 0, caching a b c. At step 1, C (prompt 12, blocks p q r, output 1) and B (prompt 12, blocks
    a b z, output 1) wait, C first. lpm: B matches a b (8 tokens), C nothing: B prefills in step 1
    (4 tokens), C in step 2. fcfs: C in step 1, B in step 2."""
    reqs = [(0, 12, 1, (1, 2, 3)), (1, 12, 1, (7, 8, 9)), (1, 12, 1, (1, 2, 5))]
    for policy, finish in (("lpm", [1.0, 3.0, 2.0]), ("fcfs", [1.0, 2.0, 3.0])):
        g = SglangConfig(schedule_policy=policy, chunked_prefill_size=0, max_running_requests=1)
        rec = records(RUNNERS[run](hand_workload(reqs, 200, g), SPEC, record_requests=True))
        assert rec["finish"] == finish, policy
        # lpm: B's 8 cached tokens are hit; fcfs: B runs after C, whose blocks a b c are still cached
        assert rec["cached_tokens"] == [0, 0, 8]


@pytest.mark.parametrize("run", RUNNERS)
def test_admission_reserves_the_outputs(run):
    """Breaks if admission ignores the output reservation or new_token_ratio. Pool 100, no prefix
    sharing. A (prompt 10, output 50) and B (prompt 10, output 50) arrive at 0. A: total = 10 + 50
    = 60 < rem_total 100: admitted; rem_total falls to 100 - 60 = 40. B: total 60 >= 40: NO_TOKEN,
    the batch is marked full. A then decodes until it finishes: its prefill is step 0 (first token
    at 1), decodes steps 1..49, finishing at 50. The batch is unmarked when the decode batch next
    filters A out, at step 50, an iteration that runs nothing; B prefills in step 50, finishing at
    100."""
    g = SglangConfig(chunked_prefill_size=0)
    wl = hand_workload([(0, 10, 50, ()), (0, 10, 50, ())], 100, g)
    rec = records(RUNNERS[run](wl, SPEC, record_requests=True))
    assert rec["admitted"] == [0.0, 50.0] and rec["finish"] == [50.0, 100.0]


@pytest.mark.parametrize("run", RUNNERS)
def test_the_running_reservation_is_scaled_by_new_token_ratio(run):
    """Breaks if running requests reserve their whole output. Pool 121, max_model_len 120. A
    (prompt 10, output 100) arrives at 0: total 110 < 121, admitted, prefilled in step 0. B
    (prompt 10, output 5) arrives at 1. At step 1 (no decode step yet, so the ratio is still its
    initial 0.7): rem_total = free 111 - min(99, 4096) x 0.7 = 41.7; B's total 15 < 41.7: admitted
    and prefilled in step 1 while A waits (no mixing). Reserving A's whole 99 would leave 12 < 15
    and refuse B. B decodes with A from step 2 and finishes after 4 decodes, at 6; A's 99 decodes
    are steps 2 to 100: it finishes at 101."""
    g = SglangConfig(chunked_prefill_size=0)
    wl = hand_workload([(0, 10, 100, ()), (1, 10, 5, ())], 121, g, mml=120)
    rec = records(RUNNERS[run](wl, SPEC, record_requests=True))
    assert rec["admitted"] == [0.0, 1.0]
    assert rec["first_token"] == [1.0, 2.0] and rec["finish"] == [101.0, 6.0]


@pytest.mark.parametrize("run", RUNNERS)
def test_retraction_takes_the_last_of_the_fewest_outputs_and_raises_the_ratio(run):
    """Breaks if retract_decode picks another victim, frees the wrong tokens, or re-admits too
    early. Pool 61, max_model_len 55, no shared prefixes, conservativeness 0.01 (ratio 0.007).
    A (prompt 10, output 40) at 0: total 10 + 40 = 50 < 61, prefilled in step 0 (free 51). B (the
    same) at 1: rem_total = 51 - 39 x 0.007 = 50.727 > 50: prefilled in step 1 (free 41). From
    step 2 both decode, 2 tokens a step: after step 21 free is 41 - 2 x 20 = 1, A and B hold 30
    each and have generated 21 each. Step 22: check_decode_mem wants 2 free: retract. Equal keys
    (21 outputs, prompt 10): the last in batch order, B, goes; 30 tokens freed (free 31 >= 20 x 1
    left); the ratio becomes min(1, (21 + 20) / 40) = 1. A decodes on and finishes its 40th token
    at the end of step 40 (t = 41). B waits: total = its 31 tokens to prefill + 19 still to come =
    50 > free 30 - A's 18 x ~1. At 41 the finished A is filtered out (an iteration that runs
    nothing), and B (50 < 61) prefills 31 tokens in step 41 (its 22nd token), then decodes 18 more
    in steps 42 to 59: it finishes at 60."""
    g = SglangConfig(chunked_prefill_size=0, schedule_conservativeness=0.01)
    wl = hand_workload([(0, 10, 40, ()), (1, 10, 40, ())], 61, g, mml=55)
    r = RUNNERS[run](wl, SPEC, record_requests=True)
    rec = records(r)
    assert rec["preemptions"] == [0, 1] and r.recomputed_tokens == 30
    assert rec["admitted"] == [0.0, 1.0] and rec["first_token"] == [1.0, 2.0]
    assert rec["finish"] == [41.0, 60.0]
    assert new_token_ratios(0.01)[0] == pytest.approx(0.007)


# -- the workload file and the command line --------------------------------------------------------


def _write(tmp_path, text: str):
    path = tmp_path / "w.yaml"
    path.write_text(text, encoding="utf-8")
    return path


SERVE = """pool: {slots: 4000}
requests: {count: 30, prompt: {dist: uniform, low: 10, high: 300}, output: {dist: uniform, low: 1, high: 50},
           arrival: {process: poisson, rate: 1}}
prefix: {system_prompts: 2, system_prompt_len: 64}
scheduler: {max_model_len: 1024}
"""


def test_engine_key_and_flag_select_sglang(tmp_path):
    """Breaks if `engine:` or --engine's override does not reach the simulator, or changes a vLLM run."""
    from kvplan.experiments import load
    from kvplan.sim.engine import simulate_all

    plain = load(_write(tmp_path, SERVE))
    assert plain.sglang is None
    vllm_labels = [r.label for r in simulate_all(plain)]
    assert vllm_labels == ["paged-B16", "paged-B16 no-cache"]
    flagged = load(tmp_path / "w.yaml", engine="sglang")
    keyed = load(_write(tmp_path, SERVE + "engine: sglang\nsglang: {schedule_policy: fcfs, chunked_prefill_size: -1}\n"))
    assert flagged.sglang.schedule_policy == "lpm" and flagged.sglang.chunked_prefill_size == 8192
    assert keyed.sglang.schedule_policy == "fcfs" and keyed.sglang.chunked_prefill_size == 0
    # the no-cache twin turns the radix cache off (and with it lpm)
    assert [r.label for r in simulate_all(flagged)] == ["sglang", "sglang no-cache"]
    assert load(tmp_path / "w.yaml", engine="vllm").sglang is None  # --engine vllm over `engine: sglang`


def test_the_workload_a_flag_run_writes_keeps_the_engine(tmp_path):
    """Breaks if --show-workload's YAML drops engine: sglang or its flags (read back, the same)."""
    from kvplan.workload.schema import read_spec
    from kvplan.workload.distributions import Fixed, Lengths
    from kvplan.workload.spec import PoolRequest, SglangSpec, SyntheticRequests, WorkloadSpec
    from kvplan.workload.spec_yaml import spec_yaml

    lengths = Lengths(Fixed(10), 1)
    spec = WorkloadSpec(name="x", pool=PoolRequest(slots=4000), requests=SyntheticRequests(3, lengths, lengths),
                        engine="sglang", sglang=SglangSpec(schedule_policy="fcfs", max_running_requests=7))
    back = read_spec(_write(tmp_path, spec_yaml(spec)))
    assert (back.engine, back.sglang) == ("sglang", spec.sglang)


def test_sglang_runs_restate_the_step_constants_for_sglang():
    """Breaks if engine: sglang does not apply SGLang's overhead and API-server factors (and only those)."""
    from kvplan.model.step_time import ENGINE_OVERHEAD_FACTOR, SERVER_FRONTEND_FACTOR, CONSTANTS, engine_constants

    c = engine_constants(CONSTANTS, "sglang")
    assert c.frontend_latency_s == CONSTANTS.frontend_latency_s * SERVER_FRONTEND_FACTOR["sglang"]
    assert c.step_overhead_s == CONSTANTS.step_overhead_s * ENGINE_OVERHEAD_FACTOR["sglang"]
    assert c.stream_token_s == CONSTANTS.stream_token_s * min(SERVER_FRONTEND_FACTOR["sglang"], 1.0)
    assert c.gemm_efficiency == CONSTANTS.gemm_efficiency


def test_a_flag_only_sglang_run_starts_as_sglang_would():
    """Breaks if --engine sglang on a flag-only run keeps vLLM's pool or limits instead of SGLang's
    own start-up (kvplan size --engine sglang: max_total_num_tokens, max_running_requests,
    chunked_prefill_size)."""
    from kvplan.experiments import build_flags, flag_workload
    from kvplan.model.sglang_size import sglang_size

    spec = flag_workload("meta-llama/Llama-3.1-8B-Instruct", "H100-80GB", 1, 2.0, "1000", "200", 10)
    m = sglang_size("meta-llama/Llama-3.1-8B-Instruct", gpu="H100-80GB").memory
    sg = flag_workload("meta-llama/Llama-3.1-8B-Instruct", "H100-80GB", 1, 2.0, "1000", "200", 10, engine="sglang")
    assert (sg.engine, sg.pool.mem_fraction_static) == ("sglang", "default")
    wl = build_flags(sg)
    assert wl.pool.slots == m.max_total_num_tokens
    assert (wl.sglang.max_running_requests, wl.sglang.chunked_prefill_size) == (m.max_running_requests,
                                                                               m.chunked_prefill_size)
    assert spec.pool.kv_memory is not None and spec.engine == "vllm"  # vLLM's, for comparison
