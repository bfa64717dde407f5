"""bench/timing_fidelity.py's restatement of SGLang's measured runs by SGLang's own rules
(sglang_setup, overlap_lag, prefill_share; bench/sglang_fidelity.py compares it with vLLM's)."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import ROOT, bench_module

CORPUS = ROOT / "tests" / "data" / "step_time_measurements.yaml"


@pytest.fixture(scope="module")
def bench():
    return bench_module("timing_fidelity")


@pytest.fixture(scope="module")
def entries():
    return {e["id"]: e for e in yaml.safe_load(CORPUS.read_text(encoding="utf-8"))["measurements"]}


def test_server_flags_are_read_from_the_quoted_launch_command(bench, entries):
    """The datacrunch 405B runs launch with --disable-radix-cache and --mem-frac 0.87, the
    MiniMax-M2 cookbook runs with --mem-fraction-static 0.85; gpustack's launch states neither."""
    flags = bench.sglang_flags(entries["datacrunch-llama31-405b-h200-sglang-tp8-random1024-1024-rps1"])
    assert flags == {"mem_fraction_static": 0.87, "disable_radix_cache": True}
    assert bench.sglang_flags(entries["sglang-cookbook-minimax-m2-mi300x-tp4-1000-1000-c16"])["mem_fraction_static"] == 0.85
    assert bench.sglang_flags(entries["gpustack-qwen3-8b-h100sxm-sglang-c4"]) == {"disable_radix_cache": False}


def test_an_sglang_run_restated_by_sglangs_rules_takes_kvplan_size_engine_sglang_pool(bench, entries):
    """The pool, running cap and chunk of the restated run are what `kvplan size --engine sglang`
    gives for the same model, GPU, TP and release (sglang_size), and the scheduler is SGLang's; by
    default (SGLANG_AS_SGLANG off) the run keeps vLLM's restatement."""
    from kvplan.model.sglang_size import sglang_size

    entry = entries["gpustack-qwen3-8b-h100sxm-sglang-c4"]
    workload, arrival, _, _ = bench.build_case(entry, {"_sglang": True})
    w = workload(arrival)
    m = sglang_size("Qwen/Qwen3-8B", gpu="H100-80GB", tp=1, sglang_version=entry["engine_version"]).memory
    assert w.pool.slots == m.max_total_num_tokens
    assert w.sglang.max_running_requests == m.max_running_requests == w.scheduler.max_num_seqs
    assert w.sglang.chunked_prefill_size == m.chunked_prefill_size == 8192  # an 80 GB GPU (batch_defaults)
    assert w.sglang.radix_cache
    default, arrival, _, _ = bench.build_case(entry)
    assert default(arrival).sglang is None and bench.SGLANG_AS_SGLANG is False
    # the stated --disable-radix-cache and --mem-frac 0.87 reach SGLang's start-up
    entry = entries["datacrunch-llama31-405b-h200-sglang-tp8-random1024-1024-rps1"]
    workload, arrival, _, _ = bench.build_case(entry, {"_sglang": True})
    assert not workload(arrival).sglang.radix_cache


def test_sliding_window_models_are_restated_by_sglangs_rules(bench, entries):
    """gpt-oss (sliding-window layers kept in SGLang's one pool) and Llama 4 (SGLang's hybrid SWA
    pool, served on the smaller of its two pools: kvplan/model/sglang_memory.py rule 5) run on
    SGLang's own scheduler, no longer on vLLM's restatement."""
    entry = entries["gpustack-gptoss20b-h100-sglang-sharegpt"]
    assert bench.sglang_restated(entry)
    workload, arrival, _, _ = bench.build_case(entry, {"_sglang": True})
    assert workload(arrival).sglang is not None
    scout = entries["sglang-cookbook-llama4-scout-mi300x-tp8-1000-1000-c16"]
    assert bench.sglang_restated(scout)
    workload, arrival, _, _ = bench.build_case(scout, {"_sglang": True})
    served = workload(arrival)
    from kvplan.model.sglang_size import sglang_size

    m = sglang_size("meta-llama/Llama-4-Scout-17B-16E-Instruct", gpu="MI300X", tp=8).memory
    assert m.hybrid and served.pool.slots == m.serving_tokens == m.swa_tokens


def test_the_overlap_schedulers_extra_step_is_where_the_overlap_scheduler_runs(bench, entries):
    """SGLang 0.4 on schedules with its overlap loop (a request waits a step more); 0.3.0 in
    series; one request at a time finds the engine idle; vLLM's restatement has no such step."""
    own = {"_sglang": True}
    assert bench.overlap_lag(entries["gpustack-qwen3-8b-h100sxm-sglang-c4"], own)
    assert not bench.overlap_lag(entries["gpustack-qwen3-8b-h100sxm-sglang-c4"], {"_sglang": False})
    assert not bench.overlap_lag(entries["sglang030-llama31-8b-a100-rps4"], own)
    assert not bench.overlap_lag(entries["sglang-cookbook-llama31-70b-a100-tp8-1000-1000-c1"], own)


def test_a_median_itl_of_separate_prefill_steps_is_a_decode_step_and_ttft_waits_one(bench, entries):
    """datacrunch's 70B at 1 request/s: a prefill step every second among ~70 decode steps, so the
    client's median inter-token gap is a decode step alone, below the median TPOT by the prefill
    steps' share of the time; TTFT and E2E gain that decode step (the overlap scheduler)."""
    entry = entries["datacrunch-llama33-70b-h200-sglang-tp4-random1024-1024-rps1"]
    own = {**bench.shipped_values(), "_sglang": True}
    r = bench.run_case(entry, own)
    share, gaps = bench.prefill_share(entry, own, r)
    assert 0 < share < 0.2 and gaps < bench.GAPS_WITH_PREFILL_MAX
    got = bench.predictions(entry, own)
    step = r.tpot.mean * (1 - share)
    assert got["itl"][0] == pytest.approx(r.tpot.p50 * (1 - share) * 1e3)
    assert got["ttft"][0] == pytest.approx((r.ttft.p50 + step) * 1e3)
    assert got["e2e"][0] == pytest.approx(r.e2e.p50 + step)


@pytest.fixture(scope="module")
def moe_bench():
    return bench_module("sglang_fidelity")


def test_moe_bias_groups_runs_by_engine_and_vendor_with_signed_and_absolute_medians(moe_bench):
    """By hand: vLLM on NVIDIA, ITL errors +10%, -30%, +20% -> signed median +10%, |errors| 10, 30,
    20 -> 20%; throughput only in one row (+5%); SGLang on AMD one row: its own figures; a metric
    no row of a group has (SGLang's throughput) is left out."""
    rows = [("vllm", "NVIDIA", {"itl": 0.1, "throughput": 0.05}), ("vllm", "NVIDIA", {"itl": -0.3}),
            ("vllm", "NVIDIA", {"itl": 0.2}), ("sglang", "AMD", {"itl": -0.4})]
    out = moe_bench.bias(rows)
    assert list(out) == [("sglang", "AMD"), ("vllm", "NVIDIA")]
    n, signed, absolute = out[("vllm", "NVIDIA")]["itl"]
    assert n == 3 and signed == pytest.approx(0.1) and absolute == pytest.approx(0.2)
    assert out[("vllm", "NVIDIA")]["throughput"] == (1, 0.05, 0.05)
    assert out[("sglang", "AMD")] == {"itl": (1, -0.4, 0.4)}


def test_gpu_vendor_reads_the_catalog(moe_bench, entries):
    """The cookbook's MI300X runs are on AMD GPUs, its B200 runs and aiconfigurator's H200 runs on
    NVIDIA's (kvplan/model/gpus.json's vendor field)."""
    assert moe_bench.gpu_vendor(entries["sglang-cookbook-llama4-scout-mi300x-tp8-1000-1000-c16"]) == "AMD"
    assert moe_bench.gpu_vendor(entries["sglang-cookbook-dsr1-0528-b200-tp8-1000-1000-c16"]) == "NVIDIA"
    assert moe_bench.gpu_vendor(entries["aiconfigurator-silicon-deepseek-r1-h200-sglang059-tp8-1024-1024-c64"]) == "NVIDIA"


def test_a_run_that_states_no_release_takes_the_rules_of_its_sources_date(bench, entries):
    """datacrunch's runs state no SGLang release; their output files were committed on 2024-12-14
    (source_date), before sgl-project/sglang#7054 (merged 2025-06-10) brought the 0.4.7 memory
    rule, so the 0.4 era's rule applies: mem_fraction_static 0.85 at TP 4 (its table: tp >= 4 ->
    0.85), where the 405B runs' stated --mem-frac 0.87 wins. A run stating a release keeps it;
    one with neither takes the current rules."""
    from kvplan.model.sglang_memory import SGLANG_RELEASE

    entry = entries["datacrunch-llama33-70b-h200-sglang-tp4-random1024-1024-rps16"]
    assert entry["engine_version"] is None and entry["source_date"] == "2024-12-14"
    assert bench.sglang_release(entry) == "0.4.0"
    assert bench.sglang_release(entries["gpustack-qwen3-8b-h100sxm-sglang-c4"]) == entries[
        "gpustack-qwen3-8b-h100sxm-sglang-c4"]["engine_version"]
    assert bench.sglang_release({**entry, "source_date": None}) == SGLANG_RELEASE
    own = bench.sglang_setup(entry, *_restate_args(bench, entry))
    assert own[2].mem_fraction_static == 0.85
    big = entries["datacrunch-llama31-405b-h200-sglang-tp8-random1024-1024-rps1"]
    assert bench.sglang_setup(big, *_restate_args(bench, big))[2].mem_fraction_static == 0.87


def _restate_args(bench, entry):
    """(spec, layout, weights, gpu, tp, context) as build_case restates the entry."""
    from kvplan.model.build import build_layout
    from kvplan.model.gpus import get_gpu
    from kvplan.model.weights import estimate_weights

    spec, online = bench._spec_and_quant(entry["model"], entry.get("quantization"))
    tp = entry["tp"]
    layout = build_layout(spec, "auto", tp)
    context = entry["setup"].get("max_model_len") or spec.max_context or 32768
    return spec, layout, estimate_weights(spec, online), get_gpu(bench._gpu(entry["gpu"])), tp, int(context)


def test_a_one_client_run_whose_duration_holds_a_cold_start_has_its_throughput_left_out(bench, entries):
    """By hand from the printed figures. Llama 4 Scout on MI300X, one client, 10 prompts: mean TTFT
    4246.98 ms, median 68.57 ms -> 10 x 4178.41 = 41,784 ms of first-token wait over the median,
    more than a whole median request (E2E 4489.77 ms): a cold start; its throughput is left out,
    its medians kept. gpt-oss-120b on B200, one client, 100 prompts: 100 x (33.71 - 31.79) = 192 ms,
    under its median E2E (389.9 ms): compared. A run of 16 clients is never taken for one (its TTFT
    tail is queueing)."""
    scout = entries["sglang-cookbook-llama4-scout-mi300x-tp8-1000-1000-c1"]
    assert bench.cold_start(scout)
    out = bench.predictions(scout)
    assert "throughput" not in out and {"ttft", "itl", "e2e"} <= set(out)
    gptoss = entries["sglang-cookbook-gptoss-120b-b200-tp8-sharegpt-c1"]
    assert not bench.cold_start(gptoss) and "throughput" in bench.predictions(gptoss)
    assert not bench.cold_start(entries["sglang-cookbook-llama4-scout-mi300x-tp8-1000-1000-c16"])
    # the same figures at 16 clients: the rule is for one client only
    assert not bench.cold_start({**scout, "setup": {**scout["setup"], "max_concurrency": 16}})


def test_bench_servings_random_lengths_are_the_ones_it_sent(bench, entries):
    """sglang.bench_serving seeds numpy with --seed 1 and draws n input lengths, then n output
    lengths: the totals the cookbook's runs print (their notes) are those draws' sums, at ratio 0.0:
    10 prompts of up to 1000/1000 -> 6,101 input and 4,220 output tokens; 80 -> 39,668 / 40,805;
    320 of up to 8000/1000 -> 1,273,893 / 170,000."""
    for n, (lin, lout), (tin, tout) in ((10, (1000, 1000), (6101, 4220)), (80, (1000, 1000), (39668, 40805)),
                                        (320, (8000, 1000), (1273893, 170000))):
        prompt, output = bench.bench_serving_random_lengths(lin, lout, 0.0, n)
        assert (int(prompt.sum()), int(output.sum())) == (tin, tout)
        assert prompt.min() >= 1 and prompt.max() <= lin and output.min() >= 1 and output.max() <= lout
    # each length drawn from [max(1, L x ratio), L]
    prompt, output = bench.bench_serving_random_lengths(1000, 100, 0.5, 200)
    assert prompt.min() >= 500 and output.min() >= 50
    # the closed-loop cookbook run is restated with them; a run at a request rate keeps its own draw
    entry = entries["sglang-cookbook-llama31-70b-a100-tp8-1000-1000-c16"]
    workload, arrival, _, _ = bench.build_case(entry)
    sent = next(iter(workload(arrival).make_requests()))
    assert int(sent.prompt_len.sum()) == 39668 and int(sent.output_len.sum()) == 40805
    rate = entries["datacrunch-llama33-70b-h200-sglang-tp4-random1024-1024-rps1"]
    workload, arrival, _, _ = bench.build_case(rate)
    drawn = bench.bench_serving_random_lengths(1024, 1024, 0.0, 300)[0]
    assert int(next(iter(workload(arrival).make_requests())).prompt_len.sum()) != int(drawn.sum())
