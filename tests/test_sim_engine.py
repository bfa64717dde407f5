"""The fast engine against the step-by-step reference, plus conservation, determinism and math."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from kvplan.sim import kernel as K
from kvplan.sim.engine import KernelState, serve_document, simulate
from kvplan.sim.inputs import make_setup, prepared_chunks
from kvplan.sim.reference import simulate_reference
from kvplan.sim.sweep import rate_sweep
from kvplan.workload.records import (AllocatorSpec, PoolSpec, RequestChunk, SchedulerConfig,
                              TimingConfig, Workload)
from tests.test_sim_reference import make_workload


def random_workload(seed: int, big: bool = False) -> tuple[Workload, AllocatorSpec, int]:
    """A random small serving run: sizes, arrivals, scheduler, allocator and timing all vary."""
    rng = np.random.default_rng([seed, int(big)])
    n = int(rng.integers(40, 160) if big else rng.integers(1, 30))
    mml = int(rng.integers(64, 512) if big else rng.integers(8, 64))
    timed = bool(rng.random() < 0.5)
    prompt = rng.integers(1, mml + 8, n)
    output = rng.integers(0, int(rng.choice([40, 300])) if big else 40, n)
    arrival = np.cumsum(rng.exponential(rng.choice([0.5, 3, 20]), n))
    if rng.random() < 0.2:
        arrival[:] = 0.0
    if timed:
        arrival *= float(rng.choice([1e-7, 1e-5]))
    chunked = bool(rng.random() < 0.5)
    budget = int(rng.integers(1, 2 * mml)) if chunked else int(rng.integers(mml, 2 * mml + 1))
    mode = "swap" if rng.random() < 0.4 else "recompute"
    sched = SchedulerConfig(int(rng.integers(1, 24 if big else 10)), budget, mml, chunked, mode,
                            int(rng.integers(0, 8 * mml)), bool(rng.random() < 0.5))
    if rng.random() < 0.5:
        b = int(rng.choice([1, 2, 3, 4, 8, 16]))
        spec = AllocatorSpec("paged", block_size=b)
        slots = int(rng.integers(-(-mml // b) * b, 4 * mml + b + 1)) + (b if sched.null_block else 0)
    else:
        limit = mml + int(rng.integers(0, 2)) * int(rng.integers(0, 40))
        policy = str(rng.choice(["max", "pow2", "oracle"]))
        spec = AllocatorSpec("contiguous", policy=policy, max_len=limit)
        slots = int(rng.integers(limit, 5 * mml + limit))
    timing = random_timing(rng, timed)
    size = int(rng.integers(1, n + 1))

    def make():
        for s in range(0, n, size):
            yield RequestChunk(arrival[s:s + size], prompt[s:s + size], output[s:s + size])

    wl = Workload("random", "", seed, "serve", n, PoolSpec(slots), (spec,), sched, timing, make)
    return wl, spec, int(rng.choice([4, 8, 64, 2048]))


def random_timing(rng, timed: bool) -> TimingConfig:
    """The timing of a random workload: none (one tick a token), or constants of a few hundred to a
    few hundred thousand picoseconds, half of them on the physical model (a curve per step size,
    requests, pairs: random_step_model)."""
    if not timed:
        return TimingConfig()
    timing = TimingConfig("test-gpu", 1e12, 1e12, int(rng.integers(0, 300_000)),
                          float(rng.integers(0, 50_000)), int(rng.integers(0, 20_000)),
                          1.0, 1.0, float(rng.integers(0, 3)) * 1e-8)
    if rng.random() < 0.5:
        timing = replace(timing, step=random_step_model(rng))
    return timing


def random_step_model(rng):
    """A StepModel of random small sizes (dense or MoE, tp 1-4): ticks of tens to thousands."""
    from kvplan.model.step_time import StepConstants, StepModel

    experts = int(rng.choice([0, 8, 64]))
    service = float(rng.choice([0.0, 1e-8, 1e-7]))  # the API server's time per request, in seconds
    return StepModel(
        hbm_bytes_per_s=1e12, peak_flops=float(rng.choice([1e13, 1e14])), attention_flops=1e14,
        link_bytes_per_s=1e11, tp=int(rng.integers(1, 5)), dense_bytes=int(rng.integers(0, 200_000)),
        dense_flops_per_token=float(rng.integers(0, 2_000_000)), expert_bytes=int(rng.integers(0, 400_000)),
        expert_flops_per_token=float(rng.integers(0, 500_000)), num_experts=experts,
        top_k=min(2, experts), lm_head_flops_per_request=float(rng.integers(0, 100_000)),
        kv_bytes_per_token=int(rng.integers(0, 5_000)), attention_flops_per_pair=float(rng.integers(0, 200_000)),
        hidden=int(rng.integers(8, 64)), num_layers=int(rng.integers(1, 8)),
        enforce_eager=bool(rng.random() < 0.3),
        constants=StepConstants(frontend_request_s=service, stream_token_s=float(rng.choice([0.0, 1e-9]))))


def as_json(result) -> str:
    cols = {k: v.tolist() for k, v in result.requests.columns.items()}
    return json.dumps([result.to_dict(), result.timeline.to_dict(), cols])


def run_to_end(wl, spec):
    """The fast engine's setup and final kernel state after the whole workload."""
    setup = make_setup(wl, spec)
    state = KernelState(setup)
    for chunk in prepared_chunks(wl, setup):
        state.load(chunk)
        state.run(final=False)
    state.run(final=True)
    return setup, state


def assert_engines_agree(wl, spec, points: int) -> None:
    """The fast engine and the step-by-step reference give the same result to the byte."""
    fast = simulate(wl, spec, record_requests=True, timeline_points=points)
    slow = simulate_reference(wl, spec, record_requests=True, timeline_points=points)
    assert as_json(fast) == as_json(slow)


@pytest.mark.parametrize("seed", range(240))
def test_engine_equals_reference_on_random_small_workloads(seed):
    """Breaks if any jump, event or accounting of the fast engine differs from the plain steps."""
    assert_engines_agree(*random_workload(seed))


@pytest.mark.parametrize("seed", range(16))
def test_engine_equals_reference_on_random_larger_workloads(seed):
    """Breaks if long jumps (hundreds of steps, many block boundaries) lose exactness."""
    assert_engines_agree(*random_workload(seed, big=True))


@pytest.mark.parametrize("seed", range(40))
def test_conservation(seed):
    """Breaks if a request is lost or finishes out of order, or memory leaks or is invented."""
    wl, spec, _ = random_workload(seed, big=seed % 2 == 1)
    setup, state = run_to_end(wl, spec)
    raw = state.raw()
    assert raw.finish.size == wl.num_requests == int(state.st[K.DONE])
    assert np.all(raw.arrival <= raw.admitted) and np.all(raw.admitted < raw.first_token)
    assert np.all(raw.first_token <= raw.finish) and raw.finish.max(initial=0) == raw.t_end
    assert state.st[K.NUM_RUNNING] == state.st[K.REQUEUE_LEN] == state.st[K.SWAPPED_LEN] == state.st[K.SWAP_USED] == 0
    if setup.paged:
        assert state.st[K.FREE_BLOCKS] == setup.num_blocks
    else:
        assert state.st[K.NUM_FREE_RUNS] == 1 and state.run_len[0] == setup.slots
    result = simulate(wl, spec)
    assert sum(result.breakdown.values()) == pytest.approx(1.0, abs=1e-12)
    assert all(v >= 0 for v in result.breakdown.values())


def test_determinism():
    """Breaks if two identical runs differ in any reported digit."""
    wl, spec, _ = random_workload(7, big=True)
    assert as_json(simulate(wl, spec, record_requests=True)) == as_json(
        simulate(wl, spec, record_requests=True))


def test_engine_jumps_over_most_steps():
    """Breaks if event skipping stops working (the engine would step token by token)."""
    wl = make_workload([(i * 50, 5, 40) for i in range(20)], 256, max_model_len=64)
    setup = make_setup(wl, AllocatorSpec("paged", block_size=16))
    state = KernelState(setup)
    for chunk in prepared_chunks(wl, setup):
        state.load(chunk)
    state.run(final=True)
    assert state.st[K.STEPS] == 20 * 40 and state.st[K.EVENTS] <= 3 * 20


def test_timeline_is_evenly_spaced_after_downsampling():
    """Breaks if downsampling loses the grid or overfills the buffer."""
    wl = make_workload([(i * 3, 5, 30) for i in range(40)], 256, max_model_len=64)
    result = simulate(wl, AllocatorSpec("paged", block_size=4), timeline_points=16)
    times = result.timeline.columns["time"]
    assert 8 <= len(times) <= 15
    assert np.all(np.diff(times) == result.timeline.interval)


def test_progress_is_reported():
    """Breaks if the progress callback is never called or reports a wrong total."""
    calls = []
    wl = make_workload([(i, 5, 5) for i in range(30)], 256, max_model_len=64, chunk_size=7)
    simulate(wl, AllocatorSpec("paged", block_size=4),
             progress=lambda done, n: calls.append((done, n)))
    assert calls and calls[-1] == (30, 30)


def test_serve_document_has_one_result_per_allocator():
    """Breaks if `kvplan check` / `simulate --json` lose an allocator or the stable keys."""
    specs = (AllocatorSpec("contiguous", policy="max", max_len=16),
             AllocatorSpec("paged", block_size=4))
    wl = replace(make_workload([(0, 5, 3), (1, 4, 4)], 64, max_model_len=16), allocators=specs)
    doc = serve_document(wl)
    assert [r["label"] for r in doc["results"]] == ["contiguous-max", "paged-B4"]
    assert doc["experiment"] == "serve" and doc["time_unit"] == "step"
    assert set(doc["results"][0]["memory_breakdown"]) == {"token_states", "reserved", "internal",
                                                          "external", "free"}


def test_rate_sweep_finds_the_highest_rate_under_the_bound():
    """Breaks if the sweep ignores the rate, or reports a rate whose latency is over the bound."""
    rng = np.random.default_rng(1)
    reqs = [(0, int(p), int(o)) for p, o in zip(rng.integers(1, 40, 200), rng.integers(1, 40, 200))]
    wl = replace(make_workload(reqs, 256, max_model_len=64, max_num_seqs=32), seed=3)
    sweep = rate_sweep(wl, AllocatorSpec("paged", block_size=4), [0.05, 0.2, 0.8, 3.2], 2.0)
    latency = [p.normalized_latency for p in sweep.points]
    assert latency == sorted(latency) and latency[0] == 1.0  # alone, one step per token
    assert sweep.max_rate in (0.05, 0.2, 0.8) and latency[-1] > 2.0
    under = [p.rate for p in sweep.points if p.normalized_latency <= 2.0]
    assert sweep.max_rate == max(under)


@pytest.mark.parametrize("x, y", [(1, 1), (2**62 - 1, 2**62 - 1), (123456789123, 987654321987),
                                  (2**31, 2**31 - 1), (0, 2**61)])
def test_mac_is_exact(x, y):
    """Breaks if the 128-bit accumulator drops carries."""
    acc = np.zeros((1, 4), dtype=np.int64)
    for _ in range(3):
        K.mac(acc, np.int64(0), np.int64(x), np.int64(y))
    assert sum(int(v) << (31 * i) for i, v in enumerate(acc[0])) == 3 * x * y


@pytest.mark.parametrize("b", [1, 3, 4, 16])
@pytest.mark.parametrize("h", [0, 1, 5, 16, 37])
def test_block_sums_match_brute_force(b, h):
    """Breaks if the closed-form block counts of a jump differ from counting step by step."""
    for length in (1, 2, 7, 33):
        blocks = [-(-(h + i + 1) // b) for i in range(length)]
        assert K.block_sums(h, length, b) == (sum(blocks), sum(i * x for i, x in enumerate(blocks)))


def test_jump_time_matches_step_by_step():
    """Breaks if the closed-form time of k decode steps differs from summing step_dt."""
    cf = np.zeros(K.NUM_SETTINGS, dtype=np.int64)
    cf[K.TIMED], cf[K.OVERHEAD], cf[K.WEIGHT_TICKS], cf[K.KV_TICKS], cf[K.FLOP_TICKS] = 1, 7, 1000, 13, 900
    for h0, n in ((0, 1), (50, 3), (500, 8), (10, 40)):
        flat, base, slope, jstar = K.jump_params(cf, h0, n)
        steps = [K.step_dt(cf, h0 + n * j, n, n, 0) for j in range(60)]
        for k in (1, 2, 17, 60):
            assert K.cum(k, flat, base, slope, jstar) == sum(steps[:k])


def test_physical_jump_time_matches_step_by_step():
    """The physical model: per-request ticks, a tabulated linear curve (and its slope beyond),
    KV ticks; the closed form of k decode steps equals the sum of step_dt."""
    table = [0, 900, 1700, 2300, 2800, 3200]
    cf = np.zeros(K.NUM_SETTINGS + len(table), dtype=np.int64)
    cf[K.TIMED], cf[K.PHYSICAL], cf[K.OVERHEAD], cf[K.REQ_TICKS], cf[K.KV_TICKS] = 1, 1, 7, 5, 13
    cf[K.LIN_LEN], cf[K.LIN_SLOPE] = len(table), 350
    cf[K.NUM_SETTINGS:] = table
    assert K.linear_ticks(cf, 3) == 2300 and K.linear_ticks(cf, 8) == 3200 + 3 * 350
    for h0, n in ((0, 1), (50, 3), (500, 8), (10, 40)):
        flat, base, slope, jstar = K.jump_params(cf, h0, n)
        steps = [K.step_dt(cf, h0 + n * j, n, n, 0) for j in range(60)]
        assert steps[0] == 7 + 5 * n + K.linear_ticks(cf, n) + 13 * h0
        for k in (1, 2, 17, 60):
            assert K.cum(k, flat, base, slope, jstar) == sum(steps[:k])
