"""Hand-worked serving runs, with every literal derived by hand, on the reference and the engine.

Each case is small enough to follow step by step in the comments; both simulators must produce
exactly these numbers.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvplan.errors import WorkloadError
from kvplan.sim.engine import simulate
from kvplan.sim.inputs import clip_lengths
from kvplan.sim.reference import simulate_reference
from kvplan.workload.records import (AllocatorSpec, PoolSpec, RequestChunk, SchedulerConfig,
                              TimingConfig, Workload)

ENGINES = {"reference": simulate_reference, "engine": simulate}


def make_workload(requests, slots, *, max_model_len=12, max_num_seqs=8, max_num_batched_tokens=None,
                  chunked_prefill=False, preemption="recompute", swap_slots=0, timing=None,
                  chunk_size=None, contiguous_max_len=None) -> Workload:
    """A workload from (arrival, prompt, output) triples; arrivals in steps unless timed."""
    arrival = np.array([r[0] for r in requests], dtype=np.float64)
    prompt = np.array([r[1] for r in requests], dtype=np.int64)
    output = np.array([r[2] for r in requests], dtype=np.int64)
    size = chunk_size or max(len(requests), 1)

    def make():
        for begin in range(0, len(requests), size):
            end = begin + size
            yield RequestChunk(arrival[begin:end], prompt[begin:end], output[begin:end])

    budget = max_num_batched_tokens or max(max_model_len, 16)
    sched = SchedulerConfig(max_num_seqs, budget, max_model_len, chunked_prefill, preemption,
                            swap_slots)
    return Workload("test", "", 0, "serve", len(requests), PoolSpec(slots), (), sched,
                    timing or TimingConfig(), make,
                    contiguous_max_len=contiguous_max_len or max_model_len)


def records(result) -> dict[str, list]:
    return {k: v.tolist() for k, v in result.requests.columns.items()}


PAGED4 = AllocatorSpec("paged", block_size=4)

# Pool of 3 blocks of 4 slots. A and B (prompt 4, output 4) arrive at 0, C (prompt 1, output 1)
# at 1. A request holds the KV it has computed: a prefill of 4 holds 4 and samples a token whose
# KV the next step computes. Step 0: A and B prefill 4 tokens each (1 block each, 1 free) and
# sample their first tokens. Step 1: A's decode needs a 2nd block and takes the free one; B needs
# one too, none is free, so the most recent running request, B itself, is preempted: its block
# is freed (1 free), its 4 tokens are discarded, and it goes to the FRONT of the waiting queue,
# ahead of C. No admission in a step that preempted. Steps 2-3: B's recompute prefill (4 + 1
# generated = 5 tokens) needs 2 blocks, only 1 is free; C would fit in it but is behind B (no
# skipping). A finishes at the end of step 3. Step 4: B is admitted again (2 blocks) and C after
# it (1 block); C's single token ends it. Steps 5-6: B decodes to its 4th token and finishes at 7.
PREEMPT_CASE = [(0, 4, 4), (0, 4, 4), (1, 1, 1)]


@pytest.mark.parametrize("engine", ENGINES)
def test_recompute_preempts_the_most_recent_and_requeues_it_first(engine):
    """Breaks if the victim, the requeue position, no-skipping or recomputed tokens change."""
    result = ENGINES[engine](make_workload(PREEMPT_CASE, 12), PAGED4, record_requests=True)
    assert records(result) == {
        "arrival": [0.0, 0.0, 1.0], "admitted": [0.0, 0.0, 4.0],
        "first_token": [1.0, 1.0, 5.0], "finish": [4.0, 7.0, 5.0],
        "prompt": [4, 4, 1], "output": [4, 4, 1], "preemptions": [0, 1, 0],
    }  # fmt: skip
    assert (result.steps, result.preemptions, result.recomputed_tokens) == (7, 1, 4)
    assert (result.swap_outs, result.peak_running) == (0, 2)
    # Tokens held per step: 8, 5, 6, 7, 6, 6, 7 = 45; blocks: 2, 2, 2, 2, 3, 2, 2 = 15 (60 slots),
    # over 7 steps x 12 slots = 84.
    assert result.breakdown == {"token_states": 45 / 84, "reserved": 0.0, "internal": 15 / 84,
                                "external": 0.0, "free": 24 / 84}
    assert result.mean_running == 9 / 7


@pytest.mark.parametrize("engine", ENGINES)
def test_swap_moves_the_victim_to_cpu_and_back(engine):
    """Breaks if swap preemption recomputes, or resumes before blocks are free."""
    wl = make_workload(PREEMPT_CASE[:2], 12, preemption="swap", swap_slots=4)
    result = ENGINES[engine](wl, PAGED4, record_requests=True)
    # As above, but B's block goes to the CPU pool (4 slots) and B resumes at step 4 as a decode
    # needing 2 blocks (holding 5 after it): the same timing in step units, nothing recomputed.
    assert records(result)["finish"] == [4.0, 7.0]
    assert (result.preemptions, result.swap_outs, result.recomputed_tokens) == (1, 1, 0)


@pytest.mark.parametrize("engine", ENGINES)
def test_swap_falls_back_to_recompute_when_the_cpu_pool_is_full(engine):
    """Breaks if a victim is swapped into a CPU pool too small for its blocks."""
    wl = make_workload(PREEMPT_CASE[:2], 12, preemption="swap", swap_slots=3)
    result = ENGINES[engine](wl, PAGED4)
    assert (result.preemptions, result.swap_outs, result.recomputed_tokens) == (1, 0, 4)


@pytest.mark.parametrize("engine", ENGINES)
def test_contiguous_first_fit_refuses_a_request_because_of_external_fragmentation(engine):
    """Breaks if first fit places differently or external fragmentation is mismeasured."""
    # 12 slots, oracle reservations of the KV each request ends holding (prompt + output - 1).
    # Step 0: R1 (3 + 2 -> 4 slots at 0..3) and R2 (1 + 4 -> 4 at 4..7) are admitted; R3 (3 + 4 ->
    # 6) does not fit the last 4 free slots: a plain shortage. R1 finishes at the end of step 1,
    # leaving free runs of 4 and 4: 8 free slots, yet R3 is refused in steps 2 and 3 (external
    # fragmentation: 8 slots). R2 finishes at 4, the runs merge, and R3 runs in steps 4-7.
    wl = make_workload([(0, 3, 2), (0, 1, 4), (0, 3, 4)], 12)
    spec = AllocatorSpec("contiguous", policy="oracle", max_len=12)
    result = ENGINES[engine](wl, spec, record_requests=True)
    rec = records(result)
    assert rec["admitted"] == [0.0, 0.0, 4.0] and rec["finish"] == [2.0, 4.0, 8.0]
    # Over 8 steps x 12 slots = 96: tokens 4+6+3+4+3+4+5+6 = 35; reserved-not-yet-used
    # 4+2+1+0+3+2+1+0 = 13; external 8 in steps 2 and 3 = 16; free 4+4+0+0+6+6+6+6 = 32.
    assert result.breakdown == {"token_states": 35 / 96, "reserved": 13 / 96, "internal": 0.0,
                                "external": 16 / 96, "free": 32 / 96}


@pytest.mark.parametrize("engine", ENGINES)
def test_contiguous_max_reserves_the_limit(engine):
    """Breaks if the max policy reserves less than the limit, or its excess is not internal."""
    # One request, 3 + 2 tokens, limit 12 in a 12-slot pool: steps 0 and 1 hold 3 then 4 tokens
    # (it ends holding 3 + 2 - 1 = 4), reserve 12; of those, 4 - held will still be used and 8
    # never will.
    wl = make_workload([(0, 3, 2)], 12)
    result = ENGINES[engine](wl, AllocatorSpec("contiguous", policy="max", max_len=12))
    assert result.breakdown == {"token_states": 7 / 24, "reserved": 1 / 24, "internal": 16 / 24,
                                "external": 0.0, "free": 0.0}


@pytest.mark.parametrize("engine", ENGINES)
def test_chunked_prefill_splits_a_prompt_by_the_budget(engine):
    """Breaks if chunks ignore the budget, or leftover budget is not offered to the next request."""
    # Budget 4 per step. A's 10-token prompt: 4 tokens in step 0, 4 in step 1, the last 2 in step
    # 2, which produces A's first token (at 3); B (prompt 2, output 1) waits until step 2, where
    # it takes the 2 tokens left and finishes. Step 3 is A's last decode.
    wl = make_workload([(0, 10, 2), (0, 2, 1)], 64, max_model_len=16, max_num_batched_tokens=4,
                       chunked_prefill=True)
    result = ENGINES[engine](wl, PAGED4, record_requests=True)
    rec = records(result)
    assert rec["admitted"] == [0.0, 2.0]
    assert rec["first_token"] == [3.0, 3.0] and rec["finish"] == [4.0, 3.0]
    assert result.steps == 4


@pytest.mark.parametrize("engine", ENGINES)
def test_roofline_step_times_in_picoseconds(engine):
    """Breaks if a step's time is not overhead + max(memory, compute) with integer picoseconds."""
    # 1 TB/s, 1 TFLOP/s, efficiencies 1: weights 1000 B -> 1000 ps, KV 10 B/token -> 10 ps/token,
    # 300 FLOP/token -> 300 ps/token. One request, prompt 4, output 3:
    # prefill max(1000, 4 x 300) = 1200 ps; decode reading 4 tokens 1040 ps; then 5 tokens 1050 ps.
    timing = TimingConfig("test-gpu", 1e12, 1e12, 1000, 300.0, 10, 1.0, 1.0, model="roofline")
    result = ENGINES[engine](make_workload([(0, 4, 3)], 12, timing=timing), PAGED4)
    assert result.time_unit == "s"
    assert result.ttft.mean == 1200e-12
    assert result.e2e.mean == 3290e-12
    assert result.tpot.mean == (1040 + 1050) / 2 * 1e-12


def test_clipping_rules():
    """Breaks if prompt/output clipping to max_model_len changes (vLLM's limits)."""
    p, o, changed = clip_lengths([20, 5, 5, 3], [4, 0, 20, 2], 16)
    assert p.tolist() == [15, 5, 5, 3] and o.tolist() == [1, 1, 11, 2] and changed == 3


@pytest.mark.parametrize("engine", ENGINES)
def test_clipped_requests_are_counted(engine):
    """Breaks if the result stops reporting how many requests were clipped at load."""
    result = ENGINES[engine](make_workload([(0, 20, 4), (0, 2, 2)], 32, max_model_len=16), PAGED4)
    assert (result.clipped, result.completed) == (1, 2)


@pytest.mark.parametrize("kwargs, field", [
    ({"max_num_batched_tokens": 8}, "scheduler.max_num_batched_tokens"),  # < max_model_len
    ({"preemption": "drop"}, "scheduler.preemption"),
    ({"max_num_seqs": 0}, "scheduler.max_num_seqs"),
])  # fmt: skip
def test_bad_scheduler_settings_are_refused(kwargs, field):
    """Breaks if settings under which a request could never run are accepted."""
    with pytest.raises(WorkloadError) as err:
        simulate(make_workload([(0, 3, 3)], 64, **kwargs), PAGED4)
    assert err.value.field == field


def test_a_pool_too_small_for_one_request_is_refused():
    """Breaks if a pool that cannot hold one max_model_len request is accepted (it would hang)."""
    with pytest.raises(WorkloadError):
        simulate(make_workload([(0, 3, 3)], 11), PAGED4)
    with pytest.raises(WorkloadError):
        simulate(make_workload([(0, 3, 3)], 11), AllocatorSpec("contiguous", policy="max"))


@pytest.mark.parametrize("engine", ENGINES)
def test_an_empty_workload_gives_an_empty_result(engine):
    """Breaks if zero requests crash the metrics."""
    result = ENGINES[engine](make_workload([], 64), PAGED4)
    assert result.completed == 0 and result.ttft.mean is None and result.makespan == 0.0


@pytest.mark.parametrize("engine", ENGINES)
def test_admission_takes_ceil_prompt_over_b_blocks(engine):
    """vLLM's allocate_slots: an 8-token prompt takes ceil(8 / 4) = 2 blocks at admission (the
    sampled token's KV is computed, and its block taken, by the next step), so a pool of 4 blocks
    admits two such requests at once; counting the sampled token (ceil(9 / 4) = 3 each) would
    admit one. With output 1 both end in that step: 16 tokens in 16 slots."""
    result = ENGINES[engine](make_workload([(0, 8, 1), (0, 8, 1)], 16, max_model_len=9), PAGED4,
                             record_requests=True)
    assert records(result)["admitted"] == [0.0, 0.0]
    assert (result.completed, result.steps, result.preemptions) == (2, 1, 0)
    assert result.breakdown["token_states"] == 1.0


@pytest.mark.parametrize("engine", ENGINES)
def test_the_null_block_is_kept_out_of_the_pool(engine):
    """With vLLM's null block a 5-block pool hands out 4: two requests of 8 tokens (2 blocks each)
    run together, a third waits; without it, all three would not fit either (6 blocks), but the
    pool's 5th block would count as free rather than external."""
    from dataclasses import replace as dc_replace

    wl = make_workload([(0, 8, 1), (0, 8, 1), (0, 8, 1)], 20, max_model_len=9)
    with_null = dc_replace(wl, scheduler=dc_replace(wl.scheduler, null_block=True))
    result = ENGINES[engine](with_null, PAGED4, record_requests=True)
    assert records(result)["admitted"] == [0.0, 0.0, 1.0]
    # step 0: 16 tokens held in 4 blocks, the null block's 4 slots external; step 1: 8 tokens
    assert result.breakdown == {"token_states": 24 / 40, "reserved": 0.0, "internal": 0.0,
                                "external": 8 / 40, "free": 8 / 40}


@pytest.mark.parametrize("seed", range(40))
def test_engine_equals_reference_with_kv_sent_by_a_prefill_replica(seed):
    """Requests that arrive holding part of their prompt's KV (a disaggregated decode replica's):
    the engine equals the reference, preemptions (which drop the sent KV) included."""
    rng = np.random.default_rng([seed, 0x9D])
    n = int(rng.integers(5, 60))
    arrival = np.sort(rng.integers(0, 40, n)).astype(np.float64)
    prompt = rng.integers(1, 40, n)
    output = rng.integers(1, 30, n)
    preload = np.array([int(rng.integers(0, p)) for p in prompt])  # 0 .. prompt - 1
    size = int(rng.integers(1, n + 1))

    def make():
        for b in range(0, n, size):
            yield RequestChunk(arrival[b:b + size], prompt[b:b + size], output[b:b + size],
                               preload=preload[b:b + size])

    wl = make_workload([(0, 1, 1)], int(rng.integers(80, 400)), max_model_len=80,
                       max_num_seqs=int(rng.integers(2, 12)), chunked_prefill=bool(seed % 2),
                       max_num_batched_tokens=int(rng.integers(80, 128)))
    from dataclasses import replace

    wl = replace(wl, make_requests=make, num_requests=n)
    spec = AllocatorSpec("paged", block_size=int(rng.choice([1, 4, 8])))
    fast, ref = simulate(wl, spec, record_requests=True), simulate_reference(wl, spec, record_requests=True)
    assert fast.to_dict() == ref.to_dict() and records(fast) == records(ref)
    plain = simulate(replace(wl, make_requests=lambda: (replace(c, preload=None) for c in make())), spec)
    assert plain.steps >= fast.steps  # sent KV never costs steps
