"""Expert, data and pipeline parallelism (kvplan/model/parallel.py, parallel_size.py, parallel_step.py)."""

from __future__ import annotations

import json

import pytest

from kvplan.errors import UsageError
from kvplan.model.build import build_layout
from kvplan.model.gpus import get_gpu
from kvplan.model.parallel import (Parallelism, check, expert_bytes_per_gpu, experts_per_rank, pp_partition,
                                   stage_bounds, stage_spec, stage_weight_bytes)
from kvplan.model.parallel_step import ParallelStep
from kvplan.model.resolve import load_spec
from kvplan.model.size import size
from kvplan.model.step import step_of
from kvplan.model.weights import estimate_weights
from tests.conftest import bench_module

GiB = 2**30


def test_stages_split_layers_as_vllm_does():
    # vllm/distributed/utils.py get_pp_indices: L // P each, the remainder one more each to the stages
    # before the last, counted back from the second to last
    assert pp_partition(32, 4) == [8, 8, 8, 8]
    assert pp_partition(27, 2) == [14, 13]  # DeepSeek-V2-Lite: vLLM's log of vllm-project/vllm#20665
    assert pp_partition(61, 4) == [15, 15, 16, 15]
    assert pp_partition(80, 3) == [27, 27, 26]
    assert stage_bounds(27, 2) == [(0, 14), (14, 27)]


def test_vllm_refusals():
    with pytest.raises(UsageError) as err:
        check(load_spec("meta-llama/Meta-Llama-3-8B"), Parallelism(1, 2, 1, True))
    assert err.value.field == "--enable-expert-parallel" and "Number of experts" in str(err.value)
    with pytest.raises(UsageError) as err:
        check(load_spec("meta-llama/Meta-Llama-3-8B"), Parallelism(1, 1, 33))
    assert err.value.field == "--pp"


def test_stages_hold_their_own_kv():
    spec = load_spec("meta-llama/Meta-Llama-3-8B")
    whole = build_layout(spec, "auto", 1).bytes_per_token  # 32 layers x 8 KV heads x 128 x 2 x 2 B
    assert whole == 131_072
    parts = [build_layout(stage_spec(spec, a, b), "auto", 1).bytes_per_token for a, b in stage_bounds(32, 4)]
    assert parts == [32_768] * 4


def test_stage_weights_add_up_to_the_model():
    # Llama-3.1-70B: untied embedding (input on the first stage, lm_head on the last), 8 KV heads
    # (no K/V copies at tp 2): the stages' shares times tp are the whole checkpoint, to rounding
    spec = load_spec("meta-llama/Llama-3.1-70B-Instruct")
    weights = estimate_weights(spec)
    par = Parallelism(tp=2, pp=4)
    total = sum(stage_weight_bytes(spec, weights, par, s) for s in range(4)) * 2
    assert abs(total - weights.bytes) <= 64
    # one stage is the TP rule itself
    assert abs(stage_weight_bytes(spec, weights, Parallelism(tp=2), 0) - weights.bytes_per_gpu(2)) <= 2


def test_experts_split_over_tp_times_dp():
    spec = load_spec("deepseek-ai/DeepSeek-V3")
    weights = estimate_weights(spec)
    experts = weights.part_bytes("experts")
    ep = Parallelism(tp=1, dp=8, expert_parallel=True)
    assert experts_per_rank(spec, ep) == 32  # 256 routed experts over EP 8
    assert expert_bytes_per_gpu(spec, weights, ep) == experts // 8
    # without EP the experts are tensor-split over tp x dp ranks instead: the same bytes, every expert
    assert expert_bytes_per_gpu(spec, weights, Parallelism(tp=1, dp=8)) == -(-experts // 8)
    assert experts_per_rank(spec, Parallelism(tp=1, dp=8)) == 256
    # the attention and dense parts are per TP rank, copied on every DP rank: a DP-8 GPU holds what
    # a tp=1 GPU holds but 7/8 of the experts
    one = stage_weight_bytes(spec, weights, Parallelism(), 0)
    assert stage_weight_bytes(spec, weights, ep, 0) == one - experts + experts // 8
    # an EP size that does not divide the experts: the first ranks hold one more (ceil)
    mixtral = load_spec("mistralai/Mixtral-8x7B-v0.1")
    assert experts_per_rank(mixtral, Parallelism(tp=1, dp=3, expert_parallel=True)) == 3


def test_pipeline_pools_match_vllms_log():
    # vllm-project/vllm#20665: DeepSeek-V2-Lite, tp 2 x pp 2 on L4s, --enforce-eager, max_model_len
    # 1024 (a build between 0.9.2 and 0.10): "Available KV cache memory" 12.13 GiB on the first stage's
    # ranks, 11.33 GiB on the second's, "GPU KV cache size: 807,792 tokens" (the first stage's blocks,
    # the fewer: 12.13 GiB / (14 layers x 1,152 B) = 807.5k)
    run = size("deepseek-ai/DeepSeek-V2-Lite", gpu="L4", tp=2, pp=2, tokens=1024, enforce_eager=True,
               vllm_version="0.10", explore=False)
    pools = [s["kv_pool_bytes"] / GiB for s in run.parallel["stages"]]
    assert pools[0] == pytest.approx(12.13, abs=0.35)
    assert pools[1] == pytest.approx(11.33, abs=0.35)
    assert run.parallel["bottleneck_stage"] == 0
    assert run.report.vllm_kv_cache_tokens == pytest.approx(807_792, rel=0.03)
    blocks = [s["num_blocks"] for s in run.parallel["stages"]]
    assert run.report.num_blocks == min(blocks)


def test_dp_ep_pool_matches_vllms_refusal():
    # vllm-project/recipes#12: Qwen3-Coder-480B FP8, -dp=8 --enable-expert-parallel on 141 GB GPUs
    # (139.8 GiB as CUDA reports it, the H200's): 48.66 GiB available at 0.9, 55.65 at 0.95, and
    # vLLM refuses max_model_len 262,144 (62.00 GiB needed)
    for utilization, logged in ((0.9, 48.66), (0.95, 55.65)):
        run = size("Qwen/Qwen3-Coder-480B-A35B-Instruct", gpu="H200", dp=8, enable_expert_parallel=True,
                   quantization="fp8", gpu_memory_utilization=utilization, vllm_version="0.10.1", explore=False)
        assert run.report.kv_pool_bytes / GiB == pytest.approx(logged, rel=0.15)
        assert run.parallel["experts_per_gpu"] == 20  # 160 experts over EP 8
        if utilization == 0.9:  # (at 0.95 kvplan's pool, 12% above the log's, just holds the 62 GiB)
            assert not run.report.fits and "62.00 GiB KV cache is needed" in run.report.reason


def test_dp_ranks_each_hold_a_pool():
    run = size("deepseek-ai/DeepSeek-V3", gpu="H200", tp=1, dp=8, enable_expert_parallel=True, tokens=8192,
               explore=False)
    p = run.parallel
    assert p["vllm_concurrency_total"] == pytest.approx(8 * p["vllm_concurrency_per_dp_rank"])
    assert p["max_concurrency_total"] == 8 * p["max_concurrency_per_dp_rank"]
    assert {"tp", "dp", "pp", "ep", "gpus", "enable_expert_parallel", "stages", "bottleneck_stage",
            "experts_per_gpu", "kv_tokens_per_dp_rank"} <= set(p)
    assert p["ep"] == 8 and p["gpus"] == 8


def test_plain_runs_have_no_parallel_section():
    plain = size("meta-llama/Meta-Llama-3-8B", gpu="H100-80GB", explore=False)
    same = size("meta-llama/Meta-Llama-3-8B", gpu="H100-80GB", dp=1, pp=1, explore=False)
    assert "parallel" not in plain.to_dict()
    assert json.dumps(plain.to_dict()) == json.dumps(same.to_dict())


def test_pipeline_step_splits_the_work():
    spec = load_spec("meta-llama/Llama-3.1-70B-Instruct")
    weights, gpu = estimate_weights(spec), get_gpu("H100-80GB")
    piped = ParallelStep(spec, weights, gpu, Parallelism(tp=4, pp=2))
    whole = ParallelStep(spec, weights, gpu, Parallelism(tp=4, pp=1))
    terms = dict(tokens=64, requests=64, kv_read=64 * 4096, pairs=0)
    stages = [piped.stage_breakdown(s, **terms) for s in range(2)]
    one = whole.stage_breakdown(0, **terms)
    # the stages read the model's weights and KV between them, once
    assert sum(s["linear_weights_read"] for s in stages) == pytest.approx(one["linear_weights_read"], rel=1e-6)
    assert sum(s["kv_read"] for s in stages) == pytest.approx(one["kv_read"], rel=1e-6)
    assert stages[0]["pipeline_send"] > 0 and stages[1]["pipeline_send"] == 0
    report = piped.report(batch=64, context=4096, chunk=8192)
    slowest = max(s["total"] for s in stages)
    assert report["decode_tokens_per_s"] == pytest.approx(64 / slowest)
    assert report["decode_itl_s"] == pytest.approx(2 * slowest)  # two micro-batches in flight


def test_all_to_all_matches_deepeps_low_latency_kernels():
    # DeepEP's README ("Performance", low-latency kernels, H800 with one 400 Gb/s CX7 NIC per GPU,
    # 128 tokens a rank, hidden 7,168, top-8, FP8 dispatch and BF16 combine): EP 128 dispatch 192 us
    # and combine 369 us; EP 16: 118 and 195 us. The network, not the GPU, bounds them: the H100's
    # catalog figures stand for the H800's.
    spec = load_spec("deepseek-ai/DeepSeek-V3")
    weights, gpu = estimate_weights(spec), get_gpu("H100-80GB")
    for ep, measured in ((128, 192e-6 + 369e-6), (16, 118e-6 + 195e-6)):
        model = ParallelStep(spec, weights, gpu, Parallelism(tp=1, dp=ep, expert_parallel=True),
                             all2all_backend="deepep_low_latency")
        assert model.all_to_all_s(128, moe_layers=1) == pytest.approx(measured, rel=0.3)
    single = ParallelStep(spec, weights, gpu, Parallelism(tp=8, expert_parallel=True))
    assert single.all_to_all_s(128, moe_layers=58) == 0.0  # dp 1: the TP group's all-reduce, no all-to-all


def test_expert_imbalance_slows_the_busiest_rank():
    spec = load_spec("deepseek-ai/DeepSeek-V3")
    weights, gpu = estimate_weights(spec), get_gpu("H200")
    par = Parallelism(tp=1, dp=8, expert_parallel=True)
    even = ParallelStep(spec, weights, gpu, par, expert_imbalance=1.0)
    skewed = ParallelStep(spec, weights, gpu, par, expert_imbalance=1.3)
    _, _, _, _, f_moe = even.stages[0]
    # a large prefill chunk is compute-bound: the busiest rank's GEMMs take 1.3x as long
    assert skewed.experts_s(8192, f_moe) == pytest.approx(1.3 * even.experts_s(8192, f_moe), rel=1e-9)
    # a small decode batch streams the weights: the skew costs it nothing
    assert skewed.experts_s(4, f_moe) == pytest.approx(even.experts_s(4, f_moe), rel=1e-9)


def test_step_report_with_parallelism():
    r = step_of("deepseek-ai/DeepSeek-V3", gpu="H200", dp=8, enable_expert_parallel=True, batch=32, context=2048,
                chunk=2048, all2all_backend="deepep_low_latency")
    p = r["parallel"]
    assert p["gpus"] == 8 and p["ep"] == 8 and p["all2all_backend"] == "deepep_low_latency"
    assert r["decode_s"]["all_to_all"] > 0 and r["decode_s"]["moe_experts"] > 0
    assert p["decode_tokens_per_s_total"] == pytest.approx(8 * r["decode_tokens_per_s"])
    assert p["decode_tokens_per_s_per_gpu"] == pytest.approx(r["decode_tokens_per_s"])
    assert r["memory"]["kv_pool_bytes"] > 0
    with pytest.raises(UsageError) as err:
        step_of("deepseek-ai/DeepSeek-V3", gpu="H200", tp=8, enable_dbo=True)
    assert err.value.field == "--enable-dbo"


def test_normal_kernels_cross_each_node_once():
    # DeepEP's normal kernels send a token over RDMA once per other node its experts lie on. By hand,
    # DeepSeek-V3 (top-8 of 256) at EP 32 over 4 nodes of 64 experts: a node holds none of a token's
    # experts with chance (192 x 191 x ... x 185) / (256 x 255 x ... x 249) = 0.0964, so the token
    # touches 4 x 0.9036 = 3.614 nodes, 2.711 of them other nodes. At EP 64 (8 nodes, one of the 8
    # routing groups each, topk_group 4) it touches at most 4 nodes: 4 x 7 / 8 = 3.5 others.
    spec = load_spec("deepseek-ai/DeepSeek-V3")
    weights, gpu = estimate_weights(spec), get_gpu("H100-80GB")

    def normal(ep: int) -> ParallelStep:
        return ParallelStep(spec, weights, gpu, Parallelism(tp=1, dp=ep, expert_parallel=True),
                            all2all_backend="deepep_high_throughput")

    assert normal(8).remote_nodes() == 0.0
    assert normal(32).remote_nodes() == pytest.approx(2.711, abs=1e-3)
    assert normal(64).remote_nodes() == pytest.approx(3.5, abs=1e-9)
    # Against DeepEP's own normal-kernel figures (docs/legacy.md: H800, one 400 Gb/s CX7 NIC per GPU,
    # 4,096 tokens a rank, FP8 dispatch, BF16 combine; "RDMA bandwidth" counts the (token, node) pairs
    # including the own node, tests/test_internode.py): EP 32 dispatch 58 GB/s, combine 57 GB/s;
    # EP 64 51 and 50 GB/s. Dispatch carries 1 + 4/128 bytes an element, combine 2.
    for ep, touched, dispatch_bw, combine_bw in ((32, 3.614, 58e9, 57e9), (64, 4.0, 51e9, 50e9)):
        logical = 4096 * touched * 7168
        measured = logical * (1 + 4 / 128) / dispatch_bw + logical * 2 / combine_bw
        assert normal(ep).all_to_all_s(4096, moe_layers=1) == pytest.approx(measured, rel=0.15)
    # the low-latency kernels send every (token, expert) pair: 6 remote pairs a token at EP 32
    low = ParallelStep(spec, weights, gpu, Parallelism(tp=1, dp=32, expert_parallel=True),
                       all2all_backend="deepep_low_latency")
    assert low.all_to_all_s(4096, moe_layers=1) > 2 * normal(32).all_to_all_s(4096, moe_layers=1)


def test_dual_batch_overlap_hides_half_the_shorter_side():
    from kvplan.model.parallel_step import DBO_HIDDEN_SHARE

    spec = load_spec("deepseek-ai/DeepSeek-V3")
    weights, gpu = estimate_weights(spec), get_gpu("H100-80GB")
    par = Parallelism(tp=1, dp=72, expert_parallel=True)
    plain = ParallelStep(spec, weights, gpu, par, all2all_backend="deepep_low_latency")
    dbo = ParallelStep(spec, weights, gpu, par, all2all_backend="deepep_low_latency", enable_dbo=True)
    batch, context = 256, 2000
    kv = batch * context
    half = plain.stage_breakdown(0, tokens=batch // 2, requests=batch // 2, kv_read=kv // 2, pairs=0)
    # two micro-batches: each computes and exchanges half the tokens (and reads the weights again)
    compute = 2 * (half["total"] - half["all_to_all"])
    a2a = 2 * half["all_to_all"]
    got = dbo.stage_breakdown(0, tokens=batch, requests=batch, kv_read=kv, pairs=0)["total"]
    assert got == pytest.approx(compute + a2a - DBO_HIDDEN_SHARE * min(compute, a2a), rel=1e-9)
    # LMSYS's two-batch-overlap ablation (https://lmsys.org/blog/2025-05-05-large-scale-ep/, decode on
    # 72 H100s, 256 tokens a GPU) measured 25.5% faster with the overlap than without: the share 0.5
    # (the prefill runs' 0.44-0.55) hides less than that decode run's 0.69, so kvplan's overlap helps,
    # but by less than 25.5%
    whole = plain.stage_breakdown(0, tokens=batch, requests=batch, kv_read=kv, pairs=0)["total"]
    assert 1.0 < whole / got < 1.255


def test_parallel_corpus_is_cited_and_held_out_by_source():
    pf = bench_module("parallel_fidelity")
    entries = pf.load()
    assert len({e["id"] for e in entries}) == len(entries)
    assert all(e["source"].startswith("https://") and e["quote"] for e in entries)
    sources = {e["source_group"] for e in entries}
    held = pf.held_out_sources(entries)
    assert len(sources) >= 7 and len(held) == -(-len(sources) // 3) and held < sources
    assert {pf.regime(e) for e in entries} == {"memory", "prefill", "decode", "DP", "PP"}
    # no source is most of the step-time rows' sources: each counts once in the per-source median
    by_source = {s: sum(1 for e in entries if e["source_group"] == s) for s in sources}
    assert max(by_source.values()) < len(entries)
    # the balanced-routing prefill runs (DeepSeek's profile, LMSYS's simulated perfect EPLB) within 15%
    for e in entries:
        if e["kind"] == "prefill_throughput" and e["parallel"].get("expert_imbalance") == 1.0:
            got = pf.predict_prefill(e)
            assert got == pytest.approx(e["measured"]["input_tokens_per_s_per_gpu"], rel=0.15), e["id"]


def test_a_one_client_closed_loop_decodes_at_the_parallel_step_models_pace():
    """bench/parallel_fidelity.py restates a tpot entry as its closed loop through kvplan's serve
    engine (the lockstep engine, even for one rank). One client sends its requests one after the
    other, so each decodes alone: its TPOT is the mean of the parallel step model's batch-1 decode
    steps over the contexts it passes (512 + 1 .. 512 + 63), priced here by stage_breakdown directly."""
    pf = bench_module("parallel_fidelity")
    entry = {"id": "one-client", "model": "Qwen/Qwen3-30B-A3B", "gpu": "H100-80GB", "engine": "vllm",
             "engine_version": "0.11.0", "quantization": None,
             "parallel": {"tp": 1, "dp": 1, "pp": 1, "enable_expert_parallel": True, "all2all_backend": None,
                          "enable_dbo": False},
             "setup": {"isl": 512, "osl": 64, "batch_per_dp_rank": 1, "concurrency": 1}}
    model = pf._step(entry, pf._async(entry))
    steps = [model.stage_breakdown(0, tokens=1, requests=1, kv_read=pf._read(model, 0, 512 + k), pairs=0)["total"]
             for k in range(1, 64)]
    assert pf.predict_tpot(entry) == pytest.approx(sum(steps) / len(steps) * 1e3, rel=1e-4)


def test_aiperfs_mean_over_twenty_rounds_from_the_warm_up_and_two_rounds():
    """Two clients: warm-up rounds of 9 ms (ignored), a steady round of 10 and 12 ms (11 ms), a drain
    round of 6 and 8 ms (7 ms). aiperf's 20 measured rounds are 19 steady ones and the drain:
    (19 x 11 + 7) / 20 = 10.8 ms."""
    import numpy as np

    pf = bench_module("parallel_fidelity")
    assert (pf.AIPERF_WARMUP_ROUNDS, pf.AIPERF_ROUNDS) == (2, 20)
    tpot = np.array([9.0, 9.0, 9.0, 9.0, 10.0, 12.0, 6.0, 8.0])
    assert pf.aiperf_mean(tpot, 2) == pytest.approx(10.8)


def test_the_mtp_what_if_is_bounded_by_the_tokens_a_step_emits():
    """bench/parallel_fidelity.mtp_speedup_at: one MTP draft token accepted with probability a emits
    1 + a tokens a step, and its verify step costs at least the plain one, so the speedup lies above
    1 (a memory-bound batch-1 step verifies two tokens for the price of about one) and below 1 + a.
    Models without MTP layers get none."""
    from kvplan.model.speculative import make_speculative

    pf = bench_module("parallel_fidelity")
    accepted = make_speculative("mtp", 1, None).acceptance[0]
    for batch in (1, 128):
        assert 1.0 < pf.mtp_speedup_at("deepseek-ai/DeepSeek-R1", "H200", 8, batch, 5120, "fp8") < 1.0 + accepted
    assert pf.mtp_speedup_at("meta-llama/Llama-3.1-8B-Instruct", "H100-80GB", 1, 8, 2048) is None


def test_the_mtp_what_if_closed_loop_is_faster_by_less_than_the_tokens_a_step_emits():
    """bench/parallel_fidelity.py's what-if runs a tpot entry's closed loop again with one MTP draft
    token a step (the lockstep engine's speculative steps): a step then emits 1 + a tokens (a, the
    published acceptance) for at least the plain step's time, so the mean TPOT falls, by less than
    1 + a. Four clients of DeepSeek-R1 on 8 H200s with EP."""
    from kvplan.model.speculative import make_speculative

    pf = bench_module("parallel_fidelity")
    entry = {"id": "mtp-loop", "model": "deepseek-ai/DeepSeek-R1", "gpu": "H200", "engine": "vllm",
             "engine_version": "0.11.0", "quantization": None, "kind": "tpot",
             "parallel": {"tp": 8, "dp": 1, "pp": 1, "enable_expert_parallel": True, "all2all_backend": None,
                          "enable_dbo": False},
             "setup": {"isl": 256, "osl": 64, "batch_per_dp_rank": 4, "concurrency": 4, "kv_cache_dtype": "fp8"}}
    assert pf.mtp_model(entry)
    accepted = make_speculative("mtp", 1, None).acceptance[0]
    plain, mtp = pf.predict_tpot(entry), pf.predict_tpot(entry, mtp=True)
    assert plain / (1.0 + accepted) < mtp < plain
