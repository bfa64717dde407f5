"""Data-parallel serving of a MoE model in lockstep (kvplan/sim/data_parallel.py): rank choice,
lockstep steps and dummy batches counted by hand, the step time against `kvplan step --dp`, one
rank against the single engine, determinism and the pool of `kvplan size --dp`."""

from __future__ import annotations

import json

import pytest

from kvplan.experiments import load as load_workload_file
from kvplan.sim.data_parallel import Balancer, LockstepSim
from kvplan.sim.engine import serve_document, simulate

MOE = "Qwen/Qwen3-30B-A3B"  # 128 experts, top-8, 48 layers


def _file(tmp_path, text: str, name: str = "w.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return load_workload_file(path)


def test_the_balancer_scores_waiting_four_times_running_and_counts_its_own_picks():
    """vLLM's get_core_engine_for_request: least waiting x 4 + running, the first rank on a tie,
    each pick one more waiting on its rank until the next refresh."""
    b = Balancer(3, interval=10)
    assert [b.choose() for _ in range(4)] == [0, 1, 2, 0]  # 0,0,0 -> 4,0,0 -> 4,4,0 -> 4,4,4: the first
    b.publish([(0, 5), (1, 0), (0, 4)])  # scores 5, 4, 4: rank 1 (first of the 4s)
    assert b.choose() == 1  # its own pick counted: scores 5, 8, 4
    assert b.choose() == 2  # then 5, 8, 8
    assert b.choose() == 0


def test_two_ranks_step_together_and_an_idle_rank_runs_dummy_batches(tmp_path):
    """Three requests of 4 prompt and 2 output tokens at t = 0, two ranks of one sequence each, in
    steps (no gpu). The balancer sends them to ranks 0, 1, 0 (scores 0,0 -> 4,0 -> 4,4: rank 0).
    Step 1: requests 0 and 1 prefill (first token at 1); step 2: both decode and finish (at 2);
    step 3: rank 0 admits request 2 (first token at 3) while rank 1, empty, runs a dummy batch;
    step 4: request 2 finishes (at 4), rank 1 again a dummy. 4 steps, 2 dummy rank steps."""
    wl = _file(tmp_path, f"model: {MOE}\npool: {{slots: 1000}}\n"
               "requests: {count: 3, prompt: {dist: fixed, value: 4}, output: {dist: fixed, value: 2}}\n"
               "scheduler: {max_num_seqs: 1, max_num_batched_tokens: 64, max_model_len: 64}\n"
               "parallel: {dp: 2, enable_expert_parallel: true}\n")
    sim = LockstepSim(wl, wl.allocators[0])
    sim.run()
    assert sim.rank_of == [0, 1, 0]
    assert [(r.first_token, r.finish) for r in sim.reqs] == [(1, 2), (1, 2), (3, 4)]
    assert sim.steps == 4 and sim.dummy_steps == 2
    result = simulate(wl, wl.allocators[0])
    assert result.steps == 4 and result.pool_slots == 2 * 1000
    assert result.data_parallel["requests_per_rank"] == [2, 1]


def test_a_lockstep_step_is_the_busy_rank_with_the_moe_of_every_rank(tmp_path):
    """Two 512-token prompts on two EP ranks (DeepEP low-latency): the API server passes the second
    on a moment later, so the first step has rank 0 prefilling 512 tokens and rank 1 running a
    dummy batch of one: the MoE layers see 513 tokens and each rank sends its own (512 the most).
    That step (request 0's TTFT) is kvplan/model/parallel_step.py's prefill of 512 on one rank with
    the experts over 513 (its float model against the clock's integer tables: within 1e-4). The
    second request, on rank 1, then prefills with rank 0 decoding its first token."""
    from kvplan.model.gpus import get_gpu
    from kvplan.model.parallel import Parallelism
    from kvplan.model.parallel_step import ParallelStep
    from kvplan.model.resolve import load_spec
    from kvplan.model.step_time import prefill_pairs
    from kvplan.model.weights import estimate_weights

    wl = _file(tmp_path, f"model: {MOE}\ngpu: H100-80GB\npool: {{slots: 100000}}\n"
               "requests: {count: 2, prompt: {dist: fixed, value: 512}, output: {dist: fixed, value: 2}}\n"
               "parallel: {dp: 2, enable_expert_parallel: true, all2all_backend: deepep_low_latency}\n")
    sim = LockstepSim(wl, wl.allocators[0])
    sim.run()
    assert sim.rank_of == [0, 1]
    first, second = sim.reqs
    assert first.arrival < second.arrival < first.first_token  # it waits for the first step
    spec = load_spec(MOE)
    step = ParallelStep(spec, estimate_weights(spec), get_gpu("H100-80GB"),
                        Parallelism(dp=2, expert_parallel=True), all2all_backend="deepep_low_latency")
    expected = step.stage_breakdown(0, tokens=512, requests=1, kv_read=0, pairs=prefill_pairs(512, 0),
                                    group_tokens=513)
    assert expected["moe_experts"] > 0 and expected["all_to_all"] > 0
    assert (first.first_token - first.arrival) / 1e12 == pytest.approx(expected["total"], rel=1e-4)
    assert sim.steps == 3 and sim.dummy_steps == 2  # rank 1 idle in step 1, rank 0 in step 3


def test_one_rank_without_expert_parallelism_is_the_single_engine(tmp_path):
    """dp: 1 without EP changes nothing vLLM runs: the lockstep run of one rank gives the numba
    engine's result to the last digit (pool, steps, every latency and the memory integrals)."""
    _one_rank_is_the_single_engine(tmp_path, 80)


def _one_rank_is_the_single_engine(tmp_path, count: int, extra: str = "") -> None:
    """A Poisson run of `count` lognormal requests (and `extra` keys) served by the numba engine and
    by the lockstep engine with one rank (dp: 1, no EP): the same documents, but for data_parallel."""
    base = (f"model: {MOE}\ngpu: H100-80GB\npool: {{gpu_memory_utilization: 0.9}}\n"
            f"requests: {{count: {count}, prompt: {{dist: lognormal, mean: 800, sigma: 0.8, min: 8, max: 6000}},"
            " output: {dist: lognormal, mean: 150, sigma: 0.8, min: 2, max: 1000},"
            " arrival: {process: poisson, rate: 12}}\nscheduler: {max_model_len: 8192}\n" + extra)
    plain = serve_document(_file(tmp_path, base, "a.yaml"))
    one = serve_document(_file(tmp_path, base + "parallel: {dp: 1}\n", "b.yaml"))
    assert one["pool_slots"] == plain["pool_slots"]
    for a, b in zip(plain["results"], one["results"]):
        assert b.pop("data_parallel")["requests_per_rank"] == [count]
        assert a == b


def test_a_dp_run_is_deterministic_and_its_ranks_share_the_load(tmp_path):
    text = (f"model: {MOE}\ngpu: H100-80GB\npool: {{gpu_memory_utilization: 0.9}}\n"
            "requests: {count: 120, prompt: {dist: lognormal, mean: 800, sigma: 0.8, min: 8, max: 6000},"
            " output: {dist: lognormal, mean: 150, sigma: 0.8, min: 2, max: 1000},"
            " arrival: {process: poisson, rate: 16}}\nscheduler: {max_model_len: 8192}\n"
            "parallel: {dp: 4, enable_expert_parallel: true}\n")
    docs = [json.dumps(serve_document(_file(tmp_path, text))) for _ in range(2)]
    assert docs[0] == docs[1]
    doc = json.loads(docs[0])
    r = doc["results"][0]
    assert r["completed"] == 120 and sum(r["data_parallel"]["requests_per_rank"]) == 120
    assert min(r["data_parallel"]["requests_per_rank"]) >= 20  # a balancer, not one rank taking all
    assert doc["parallel"]["ep"] == 4 and r["pool_slots"] == 4 * doc["parallel"]["pool_slots_per_rank"]


def test_a_rank_pool_is_what_kvplan_size_dp_frees(tmp_path):
    """The experts split over 4 EP ranks free the same memory in `kvplan size --dp 4` as in the
    workload's pool (both against their own runs at dp 1, which differ in their scheduler
    settings): the two gains agree to a block of 16 tokens."""
    from kvplan.model.size import size

    base = (f"model: {MOE}\ngpu: H100-80GB\npool: {{gpu_memory_utilization: 0.9}}\n"
            "requests: {count: 5, prompt: {dist: fixed, value: 100}, output: {dist: fixed, value: 10}}\n"
            "scheduler: {max_model_len: 16384}\n")
    plain = _file(tmp_path, base, "a.yaml").pool.slots
    ranked = _file(tmp_path, base + "parallel: {dp: 4, enable_expert_parallel: true}\n", "b.yaml").pool.slots
    one = size(MOE, gpu="H100-80GB", tokens=16384, explore=False)
    four = size(MOE, gpu="H100-80GB", tokens=16384, dp=4, enable_expert_parallel=True, explore=False)
    gain = four.parallel["kv_tokens_per_dp_rank"] - one.report.vllm_kv_cache_tokens
    assert gain > 100_000  # 3/4 of the experts' ~57 GB leave each GPU
    assert abs((ranked - plain) - gain) <= 16


@pytest.mark.parametrize("method", ["ngram", "eagle"])
def test_one_rank_with_speculative_decoding_is_the_single_engine(tmp_path, method):
    """Speculative decoding on the lockstep engine: each rank's step is its own speculative step
    (ReferenceSim.step_cost) with the shared MoE terms beside it. One rank without EP shares them
    with no one, so the run is the numba engine's speculative run to the last digit."""
    _one_rank_is_the_single_engine(tmp_path, 60, f"speculative: {{method: {method}, num_speculative_tokens: 2}}\n")


def test_speculative_ranks_emit_the_accepted_drafts(tmp_path):
    """One request of a 64-token prompt and 65 output tokens on two EP ranks, one MTP-style draft a
    step accepted always (acceptance 1.0) or never (0.0), in steps (no gpu): after the prefill's
    first token each step emits 2 tokens or 1, so the 64 others take 32 steps or 64. The idle rank
    runs dummy batches beside every one."""
    runs = {}
    for rate in (1.0, 0.0):
        wl = _file(tmp_path, f"model: {MOE}\npool: {{slots: 10000}}\n"
                   "requests: {count: 1, prompt: {dist: fixed, value: 64}, output: {dist: fixed, value: 65}}\n"
                   "scheduler: {max_num_batched_tokens: 512, max_model_len: 1024}\n"
                   f"speculative: {{method: ngram, acceptance: [{rate}]}}\n"
                   "parallel: {dp: 2, enable_expert_parallel: true}\n", f"w{rate}.yaml")
        sim = LockstepSim(wl, wl.allocators[0])
        sim.run()
        runs[rate] = sim
    assert [runs[r].steps for r in (1.0, 0.0)] == [1 + 32, 1 + 64]
    assert all(runs[r].dummy_steps == runs[r].steps for r in runs)


def test_one_mtp_layer_costs_its_share_of_the_target_moe_layers():
    """parallel_clock.draft_moe_ticks: DeepSeek-V3's MTP module is one more of its MoE layers (58
    in the target), so one pass over the ranks' tokens costs 1 / 58 of the target's shared MoE
    terms over the same tokens (experts_s is linear in the share of MoE layers, all_to_all_s in
    their number), to the tick's rounding; two passes twice that, and no MTP layer nothing."""
    from kvplan.model.gpus import get_gpu
    from kvplan.model.parallel import Parallelism
    from kvplan.model.parallel_step import ParallelStep
    from kvplan.model.resolve import load_spec
    from kvplan.model.weights import estimate_weights
    from kvplan.sim.parallel_clock import draft_moe_ticks, shared_moe_ticks

    spec = load_spec("deepseek-ai/DeepSeek-V3")
    for backend in ("allgather_reducescatter", "deepep_low_latency"):
        step = ParallelStep(spec, estimate_weights(spec), get_gpu("H200"), Parallelism(tp=4, dp=2, expert_parallel=True),
                            all2all_backend=backend)
        assert step.stages[0][2].moe_layers == 58
        tokens = [48, 17]
        target = shared_moe_ticks(step, tokens)
        one = draft_moe_ticks(step, [tokens], 1)
        assert one == pytest.approx(target / 58, abs=1)
        assert draft_moe_ticks(step, [tokens, tokens], 1) == pytest.approx(2 * one, abs=1)
        assert draft_moe_ticks(step, [tokens], 0) == 0


def test_an_mtp_draft_adds_its_layers_experts_to_every_decode_step(tmp_path):
    """One request of DeepSeek-V3 (prompt 64, output 33) on two EP ranks of 4 H200s, one MTP draft
    a step always accepted: after the prefill's first token, 16 decode steps of 2 tokens on rank 0
    beside rank 1's dummy token. Each of those steps adds one MTP layer's experts and all-to-all
    over [2, 1] tokens (draft_moe_ticks), the prefill step none: the run's shared MoE time grows by
    16 x that over the same run with the drafter's experts left out, and its requests finish that
    much later."""
    from kvplan.sim.parallel_clock import draft_moe_ticks

    wl = _file(tmp_path, "model: deepseek-ai/DeepSeek-V3\ngpu: H200\ntp: 4\npool: {slots: 20000}\n"
               "requests: {count: 1, prompt: {dist: fixed, value: 64}, output: {dist: fixed, value: 33}}\n"
               "scheduler: {max_num_batched_tokens: 512, max_num_seqs: 16, max_model_len: 1024}\n"
               "speculative: {method: mtp, num_speculative_tokens: 1, acceptance: [1.0]}\n"
               "parallel: {dp: 2, enable_expert_parallel: true}\n")
    runs = {}
    for priced in (True, False):
        sim = LockstepSim(wl, wl.allocators[0])
        if not priced:
            sim.draft_layers = 0
        sim.run()
        runs[priced] = sim
    assert runs[True].draft_layers == 1 and runs[True].steps == runs[False].steps == 1 + 16
    per_step = draft_moe_ticks(wl.parallel.step, [[2, 1]], 1)
    assert per_step > 0
    assert runs[True].moe_ticks - runs[False].moe_ticks == 16 * per_step
    assert runs[True].reqs[0].finish - runs[False].reqs[0].finish == 16 * per_step
