"""vLLM's start-up memory: weights as vLLM loads them, the KV pool it logs, and its verdicts.

Pinned numbers come from cited public start-up logs (tests/data/vllm_startup_logs.yaml, each
with its source) or are derived here by hand from a format's layout.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvplan.errors import ConfigError, KvplanError, UsageError
from kvplan.model.config import read_model
from kvplan.model.resolve import load_spec
from kvplan.model.weights import estimate_weights

GiB = 2**30
LOGS = {e["id"]: e for e in yaml.safe_load(
    (Path(__file__).resolve().parent / "data" / "vllm_startup_logs.yaml").read_text(encoding="utf-8"))["logs"]}


def loaded(log_id: str) -> float:
    return LOGS[log_id]["logged"]["model_loading_gib"]


def with_quant(model: str, quant: dict):
    spec = load_spec(model)
    return read_model({**spec.raw, "quantization_config": quant}, model, spec.source)


def test_the_corpus_is_cited_and_complete():
    assert len(LOGS) >= 20
    for entry in LOGS.values():
        assert entry["source"].startswith("https://") and entry["quote"], entry["id"]
        assert entry["outcome"] in ("started", "failed")


def test_the_cuda_graph_corpus_is_cited():
    logs = yaml.safe_load((Path(__file__).resolve().parent / "data" / "vllm_cuda_graph_logs.yaml")
                          .read_text(encoding="utf-8"))["logs"]
    assert len(logs) >= 20 and len({e["id"] for e in logs}) == len(logs)
    for entry in logs:
        assert entry["source"].startswith("https://") and entry["quote"], entry["id"]


@pytest.mark.parametrize("log_id, model, tp, gpu", [
    ("llama3-8b-80gb-tp1-v0-profiler", "meta-llama/Meta-Llama-3-8B", 1, None),
    ("llama3-8b-80gb-tp2-v0-profiler", "meta-llama/Meta-Llama-3-8B", 2, None),
    ("llama3-8b-a100-40gb-v0", "meta-llama/Meta-Llama-3-8B", 1, "A100-40GB"),
    ("gpt-oss-120b-h100-v0.14.1-oom", "openai/gpt-oss-120b", 1, "H100-80GB"),
    ("gpt-oss-120b-h100-v1-negative-kv", "openai/gpt-oss-120b", 1, "H100-80GB"),
    ("gpt-oss-20b-a100-gmu065-128k", "openai/gpt-oss-20b", 1, "A100-80GB"),
    ("gpt-oss-120b-4xa100-80gb-tp4-ray-gmu080-16k", "openai/gpt-oss-120b", 4, "A100-80GB"),
])  # fmt: skip
def test_weights_match_model_loading_took(log_id, model, tp, gpu):
    """Within 3% of vLLM's "Model loading took" line (per GPU at tp > 1), on the log's GPU (an
    A100 runs MXFP4 experts through Marlin, whose padding at TP4 adds 6.7%), with the MXFP4
    kernels its log names (the negative-kv H100 log warns of Marlin)."""
    from kvplan.model.gpus import get_gpu

    backend = LOGS[log_id].get("mxfp4_backend") or "auto"
    got = estimate_weights(load_spec(model)).bytes_per_gpu(tp, get_gpu(gpu) if gpu else None, backend) / GiB
    assert got == pytest.approx(loaded(log_id), rel=0.03)


def test_gptq_int4_checkpoint_matches_its_log():
    """Qwen2.5-72B-Instruct-GPTQ-Int4 (bits 4, group 128): 4 + (16-bit scale + 4-bit zero) / 128
    bits per linear weight, embeddings and lm_head in fp16."""
    spec = with_quant("Qwen/Qwen2.5-72B-Instruct", {"quant_method": "gptq", "bits": 4, "group_size": 128,
                                                    "desc_act": False, "sym": True})
    w = estimate_weights(spec)
    assert w.scheme == "gptq"
    assert w.bytes / GiB == pytest.approx(loaded("qwen25-72b-gptq-int4-48gb-v0-eager"), rel=0.03)


@pytest.mark.parametrize("quant, bits", [
    ({"quant_method": "fp8"}, 8),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, 8 + 32 / 16384),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, 4 + 20 / 128),
    ({"quant_method": "gptq", "bits": 8, "group_size": 64}, 8 + 24 / 64),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, 4.5),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_use_double_quant": True}, 4 + 8 / 64 + 32 / 16384),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, 8),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, 4.5 + 32 / 2**20),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                                           "group_size": 128, "symmetric": True}}}, "ignore": ["lm_head"]}, 4 + 16 / 128),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}},
      "ignore": ["lm_head"]}, 8),
])  # fmt: skip
def test_each_scheme_sizes_the_linear_layers_by_its_layout(quant, bits):
    """Llama-3-8B: embeddings and lm_head stay bf16; every linear weight takes the scheme's bits."""
    base = estimate_weights(load_spec("meta-llama/Meta-Llama-3-8B"))
    w = estimate_weights(with_quant("meta-llama/Meta-Llama-3-8B", quant))
    embed = dict((k, b) for k, _, b in base.components)["embeddings"]
    linear = sum(n for k, n, _ in base.components if k != "embeddings")
    assert w.bytes == pytest.approx(embed + linear * bits / 8, rel=1e-6)


def test_ignored_attention_stays_in_the_model_dtype():
    quant = {"quant_method": "compressed-tensors", "ignore": ["lm_head", "re:.*self_attn.*"],
             "config_groups": {"g": {"weights": {"num_bits": 4, "strategy": "group", "group_size": 128}}}}
    parts = {k: b for k, _, b in estimate_weights(with_quant("meta-llama/Meta-Llama-3-8B", quant)).components}
    base = {k: b for k, _, b in estimate_weights(load_spec("meta-llama/Meta-Llama-3-8B")).components}
    assert parts["attention"] == base["attention"] and parts["mlp"] < base["mlp"] / 3


def test_online_fp8_halves_the_linear_layers_and_refuses_a_quantized_checkpoint():
    base = estimate_weights(load_spec("meta-llama/Meta-Llama-3.1-70B"))
    fp8 = estimate_weights(load_spec("meta-llama/Meta-Llama-3.1-70B"), "fp8")
    embed = dict((k, b) for k, _, b in base.components)["embeddings"]
    assert fp8.bytes == pytest.approx(embed + (base.bytes - embed) / 2, rel=1e-9)
    assert 60 * GiB < fp8.bytes < 70 * GiB  # "near 68 GiB instead of 131", as vLLM runs it
    with pytest.raises(ConfigError, match="already quantized"):
        estimate_weights(load_spec("openai/gpt-oss-20b"), "fp8")
    with pytest.raises(KvplanError, match="unknown online quantization"):
        estimate_weights(load_spec("meta-llama/Meta-Llama-3.1-70B"), "int3")


def test_tensor_parallel_ranks_hold_the_router_whole_and_copy_kv_heads():
    """At tp beyond the KV heads each KV head is copied onto tp / kv_heads ranks; routers are whole."""
    w = estimate_weights(load_spec("meta-llama/Meta-Llama-3-8B"))  # 8 KV heads
    assert w.bytes_per_gpu(8) == -(-w.bytes // 8)
    assert w.bytes_per_gpu(16) == -(-(w.bytes + w.kv_proj_bytes) // 16)
    moe = estimate_weights(load_spec("Qwen/Qwen3-30B-A3B"))
    router = dict((k, b) for k, _, b in moe.components)["router"]
    assert moe.bytes_per_gpu(4) == -(-(moe.bytes - router) // 4) + router


# ---- the KV pool and the verdicts --------------------------------------------------------------


def size(model: str, **options):
    from kvplan.model.size import size as size_of

    return size_of(model, **options).report


def test_engine_none_keeps_the_bare_arithmetic():
    """0.92 x the device's memory less the weights (the pinned hand derivation of checks.yaml)."""
    r = size("meta-llama/Meta-Llama-3-8B", gpu="H100-80GB", tokens=8192, engine="none")
    assert r.kv_pool_bytes == 62_619_155_169 and r.memory_breakdown is None and r.engine == "none"


def test_the_vllm_pool_is_the_profile_subtracted_from_the_utilization_share():
    """The current release (0.21 on, vllm-project/vllm#38284): utilization 0.92 and the CUDA graphs
    come out of the pool; before it, 0.9 and the graphs outside."""
    r = size("meta-llama/Meta-Llama-3-8B", gpu="H100-80GB", tokens=8192)
    m = r.memory_breakdown
    assert m["requested"] == int(m["total"] * 0.92) and m["cuda_graphs_in_pool"] and m["cuda_graphs"] > 0
    assert r.kv_pool_bytes == m["requested"] - m["weights"] - m["activation"] - m["non_torch"] - m["cuda_graphs"]
    old = size("meta-llama/Meta-Llama-3-8B", gpu="H100-80GB", tokens=8192, vllm_version="0.11.2")
    o = old.memory_breakdown
    assert o["requested"] == int(o["total"] * 0.9) and not o["cuda_graphs_in_pool"]
    assert old.kv_pool_bytes == o["requested"] - o["weights"] - o["activation"] - o["non_torch"]
    assert (m["max_num_batched_tokens"], m["max_num_seqs"]) == (8192, 1024)  # vllm serve on an H100
    a100 = size("meta-llama/Meta-Llama-3-8B", gpu="A100-80GB", tokens=8192).memory_breakdown
    assert (a100["max_num_batched_tokens"], a100["max_num_seqs"]) == (2048, 256)  # A100: the small defaults
    eager = size("meta-llama/Meta-Llama-3-8B", gpu="H100-80GB", tokens=8192, enforce_eager=True)
    assert eager.memory_breakdown["cuda_graphs"] == 0
    assert eager.kv_pool_bytes == r.kv_pool_bytes + m["cuda_graphs"]  # eager: no graphs taken from the pool


@pytest.mark.parametrize("bad", ["0.8", "0.8.5", "x", "", "0.", "0.29.0.0.1", "latest", "0.1e3"])
def test_an_unknown_vllm_release_is_one_usage_error(bad):
    with pytest.raises(UsageError, match="--vllm-version"):
        size("meta-llama/Meta-Llama-3-8B", gpu="H100-80GB", tokens=8192, vllm_version=bad)


def test_a_smaller_batch_budget_leaves_more_kv():
    big = size("meta-llama/Meta-Llama-3-8B", gpu="H100-80GB", tokens=8192)
    small = size("meta-llama/Meta-Llama-3-8B", gpu="H100-80GB", tokens=8192, max_num_batched_tokens=2048,
                 max_num_seqs=256)
    assert small.kv_pool_bytes > big.kv_pool_bytes


def test_gpt_oss_20b_on_an_a100_matches_its_log():
    """Held out: gpt-oss-20b, A100 80GB, utilization 0.65, max_model_len 131072 (vLLM 0.19):
    Available KV cache memory 36.56 GiB; within max(5%, 1 GiB)."""
    log = LOGS["gpt-oss-20b-a100-gmu065-128k"]
    r = size("openai/gpt-oss-20b", gpu="A100-80GB", gpu_memory_utilization=0.65, tokens=131072,
             vllm_version=log["vllm_version"])
    assert r.kv_pool_bytes / GiB == pytest.approx(log["logged"]["available_kv_cache_gib"], abs=max(1.0, 0.05 * 36.56))
    assert r.reason is None and r.fits


def test_llama_31_8b_on_an_a100_40gb_matches_its_log():
    """Held out: Llama-3.1-8B-Instruct on GCE's a2-highgpu-1g (one A100 40GB), vLLM 0.15.1, eager,
    max_model_len 131,072, max_num_batched_tokens 8,192, default utilization (0.9 in that release):
    Available KV cache memory 19.28 GiB, "GPU KV cache size: 157,936 tokens"."""
    log = LOGS["llama31-8b-a100-gce-v1-eager-131k"]
    r = size("meta-llama/Llama-3.1-8B-Instruct", gpu="A100-40GB", tokens=131072, max_num_batched_tokens=8192,
             enforce_eager=True, vllm_version=log["vllm_version"])
    logged = log["logged"]["available_kv_cache_gib"]
    assert r.kv_pool_bytes / GiB == pytest.approx(logged, abs=max(1.0, 0.05 * logged))
    assert r.fits and r.reason is None


def test_gpt_oss_120b_on_one_h100_does_not_start_as_vllm_says():
    """vllm-project/vllm#23278: at vLLM's defaults the profile leaves nothing ("No available memory
    for the cache blocks", logged -2.14 GiB). The log states no release; it was posted in August
    2025, the time of 0.10, from a pip install in a conda environment (its collect_env: "packaged by
    Anaconda"), which in 0.10 has FlashInfer only with the [flashinfer] extra: the native sampler."""
    r = size("openai/gpt-oss-120b", gpu="H100-80GB", vllm_version="0.10.1", flashinfer=False)
    assert r.fits is False and r.reason.startswith("No available memory for the cache blocks")


def test_a_context_longer_than_the_pool_gets_vllms_error_and_estimate():
    from kvplan.model.fit import longest_context

    r = size("meta-llama/Llama-3.1-8B-Instruct", gpu="L4", tokens=131072)
    assert r.fits is False
    assert r.reason.startswith("To serve at least one request with the model's max seq len (131072)")
    assert f"the estimated maximum model length is {r.longest_context}" in r.reason or "estimated" in r.reason
    from kvplan.model.build import build_layout

    layout = build_layout(load_spec("meta-llama/Llama-3.1-8B-Instruct"))
    estimate = longest_context(layout, r.memory_breakdown["kv"], 16)
    assert f"maximum model length is {estimate}." in r.reason and 0 < estimate < 131072


def test_weights_larger_than_the_gpu_fail_at_loading():
    r = size("meta-llama/Meta-Llama-3.1-70B", gpu="L4")
    assert r.fits is False and r.reason.startswith("CUDA out of memory while loading the weights")


def test_hybrid_sliding_models_log_as_vllms_hybrid_manager_computes():
    """gpt-oss-20b: 12 full + 12 sliding (window 128) layers of 2,048 B per token each. vLLM groups
    them 12 a group, so a 16-token block is 12 x 32 KiB: 12 GiB holds 12 x 2^30 / 393,216 = 32,768
    blocks. One 131,072-token request takes 8,192 blocks in the full group and
    ceil(min(127 + 8,192, 131,072) / 16) + 1 = 521 in the sliding one: 32,768 / 8,713 = 3.7608x,
    "GPU KV cache size" int(32,768 x 131,072 / 8,713) = int(492,937.3) = 492,937 tokens."""
    r = size("openai/gpt-oss-20b", kv_memory="12GiB", tokens=131072)
    assert r.vllm_concurrency == pytest.approx(32768 / 8713)
    assert r.vllm_kv_cache_tokens == 492_937
    dense = size("meta-llama/Meta-Llama-3-8B", kv_memory="11.12GiB", tokens=8192)
    assert dense.vllm_kv_cache_tokens == 91_088  # a model of one kind keeps the plain formula


def test_mamba_hybrids_group_as_vllms_hybrid_manager_does():
    """Jamba v0.1: 4 attention layers (8 KV heads x 128 x 2 x 2 B = 4,096 B a token) and 28 Mamba
    layers of 155,648 state values (311,296 B). vLLM grows the block to 16 x ceil(311,296 /
    (16 x 4,096)) = 80 tokens (page 327,680 B, the state padded up to it) and groups 4 layers a
    group: 1 attention group and 7 state groups. 10 GiB holds 10 x 2^30 // (4 x 327,680) = 8,192
    blocks; an 8,192-token request needs ceil(8,192 / 80) = 103 attention blocks plus, with prefix
    caching on (vLLM's "align" mode), 2 pages per state group: 117, so 8,192 / 117 = 70.02x and
    int(8,192 x 8,192 / 117) = 573,580 tokens; without prefix caching 1 page: 110 blocks,
    74.47x and 610,080 tokens."""
    r = size("ai21labs/Jamba-v0.1", kv_memory="10GiB", tokens=8192)
    assert r.vllm_block_size == 80
    assert r.vllm_concurrency == pytest.approx(8192 / 117) and r.vllm_kv_cache_tokens == 573_580
    off = size("ai21labs/Jamba-v0.1", kv_memory="10GiB", tokens=8192, enable_prefix_caching=False)
    assert off.vllm_concurrency == pytest.approx(8192 / 110) and off.vllm_kv_cache_tokens == 610_080
    old = size("ai21labs/Jamba-v0.1", kv_memory="10GiB", tokens=8192, vllm_version="0.11")
    # before Mamba prefix caching one state page, and the older token line: 8,192 // 8 groups x 80
    assert old.vllm_concurrency == pytest.approx(8192 / 110) and old.vllm_kv_cache_tokens == 81_920


def test_gemma_3_1b_log_lines_from_its_logged_pool():
    """Held out (vLLM 0.13, tests/data/vllm_startup_logs.yaml): 25.39 GiB of KV, max_model_len 2,048,
    max_num_batched_tokens 8,192: "GPU KV cache size: 950,864 tokens", "461.21x" and "Add 2 padding
    layers" (4 full + 22 sliding layers, groups of 4: 6 sliding groups hold 24)."""
    log = LOGS["gemma-3-1b-it-v1-gmu095-mml2048-no-cudagraph"]
    r = size("google/gemma-3-1b-it", kv_memory=int(log["logged"]["available_kv_cache_gib"] * GiB),
             tokens=log["max_model_len"], vllm_version=log["vllm_version"])
    assert r.vllm_kv_cache_tokens == pytest.approx(log["logged"]["gpu_kv_cache_tokens"], rel=1e-3)
    assert r.vllm_concurrency == pytest.approx(log["logged"]["max_concurrency"], abs=0.05)


@pytest.mark.parametrize("tp", [1, 2])
def test_qwen3_next_takes_vllms_544_token_attention_block(tp):
    """vllm-project/vllm#32492: "the model uses non-standard block size (544)". By hand: a gated
    DeltaNet layer keeps 8,192 x 3 conv + 32 x 128 x 128 state values (1,097,728 B at bf16), an
    attention layer 2 x 2 x 256 x 2 = 2,048 B a token; 16 x ceil(1,097,728 / 32,768) = 544 (both
    halve at tp 2)."""
    assert size("Qwen/Qwen3-Next-80B-A3B-Instruct", kv_memory="10GiB", tokens=4096, tp=tp).vllm_block_size == 544


def test_a_hybrid_context_too_long_for_the_pool_gets_vllms_group_estimate():
    from kvplan.model.build import build_layout
    from kvplan.model.vllm_kv_groups import kv_groups

    r = size("Qwen/Qwen3-Next-80B-A3B-Instruct", gpu="H200", tp=2, max_num_batched_tokens=8192)
    kv = r.memory_breakdown["kv"]
    groups = kv_groups(build_layout(load_spec("Qwen/Qwen3-Next-80B-A3B-Instruct"), "auto", 2), 16, 2)
    needed = groups.request_bytes(262144, 8192)
    assert (r.reason is None) == (needed <= kv)
    longest = groups.longest_context(kv, 8192, 262144)
    assert groups.request_bytes(longest, 8192) <= kv
    assert longest == 262144 or groups.request_bytes(longest + 1, 8192) > kv


ODD = [None, True, 0, -1, 4, 128, 2.5, "x", [], [1], [128, 128], {}, {"a": 1}, "re:.*attn.*", [3, None]]
QUANT_KEYS = ["bits", "group_size", "w_bit", "zero_point", "sym", "weight_block_size", "modules_to_not_convert",
              "load_in_8bit", "load_in_4bit", "bnb_4bit_use_double_quant", "quant_algo", "quantization",
              "ignore", "exclude_modules", "llm_int8_skip_modules", "ignored_layers", "q_group_size"]


def _quantization_configs():
    from hypothesis import strategies as st

    weights = st.fixed_dictionaries({}, optional={k: st.sampled_from(ODD + ["group", "block", "channel", "int", "float"])
                                                  for k in ("num_bits", "strategy", "group_size", "block_structure",
                                                            "type", "symmetric")})
    return st.fixed_dictionaries(
        {"quant_method": st.sampled_from(["fp8", "gptq", "awq", "bitsandbytes", "mxfp4", "modelopt",
                                          "compressed-tensors", "weird", None, 3])},
        optional={**{k: st.sampled_from(ODD) for k in QUANT_KEYS},
                  "config_groups": st.one_of(st.sampled_from(ODD), st.dictionaries(
                      st.just("g"), st.one_of(st.sampled_from(ODD), st.fixed_dictionaries({"weights": weights}))))})


def test_any_quantization_config_gives_weights_or_one_error():
    """A checkpoint's quantization_config, however odd: a weight estimate or a ConfigError."""
    from hypothesis import given, settings

    spec = load_spec("meta-llama/Meta-Llama-3-8B")

    @given(quant=_quantization_configs())
    @settings(max_examples=400, derandomize=True)
    def check(quant):
        try:
            w = estimate_weights(read_model({**spec.raw, "quantization_config": quant}, "m", "m/config.json"))
        except KvplanError as exc:
            assert "\n" not in str(exc)
            return
        assert w.bytes > 0 and w.scheme

    check()


def test_a_multimodal_checkpoint_keeps_its_top_level_quantization_config():
    """Llama 4 and Gemma 3 nest the language model in text_config, and their quantized uploads
    put quantization_config at the top: the weights are still sized by it."""
    spec = load_spec("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    plain = estimate_weights(spec)
    fp8 = estimate_weights(read_model({**spec_raw_top("meta-llama/Llama-4-Scout-17B-16E-Instruct"),
                                       "quantization_config": {"quant_method": "fp8"}}, "scout-fp8", "test"))
    assert fp8.scheme.startswith("fp8") and fp8.bytes < 0.6 * plain.bytes


def spec_raw_top(model: str) -> dict:
    from kvplan.model.config import load_config
    from kvplan.model.resolve import resolve

    return load_config(resolve(model).path)


def test_every_release_from_the_oldest_has_its_sampler_bytes():
    """0.9, the oldest release kvplan models, takes the sort path's bytes without FlashInfer and
    FlashInfer's with it (no release is left out); 0.11.1-0.16 sort whether or not it is installed
    (vllm-project/vllm#26859), 0.17 on take the in-place kernels."""
    from kvplan.model.vllm_memory import OLDEST_RELEASE, sampler_bytes

    oldest = f"0.{OLDEST_RELEASE}.2"
    assert sampler_bytes(oldest, flashinfer=False) == sampler_bytes("0.16") == 38 and sampler_bytes("0.17.1") == 14
    assert sampler_bytes(oldest) == sampler_bytes("0.11.0") == sampler_bytes("0.10.1.1") == 14
    assert sampler_bytes("0.11.1") == sampler_bytes("0.11.2", flashinfer=True) == 38
    assert sampler_bytes("0.29", flashinfer=False) == 14
    assert size("meta-llama/Llama-3.1-8B-Instruct", gpu="L40S", tokens=8192, vllm_version="0.9.2").fits


@pytest.mark.parametrize("log_id", ["qwen2-7b-a100-80gb-v0.10.1-gmu025-16k", "qwen3-4b-80gb-v0.10.2-defaults-breakdown"])
def test_the_sampler_line_of_a_log_decides_its_pool(log_id):
    """Two 0.10 logs, one printing "Using FlashInfer for top-p & top-k sampling." (dennislee22, an
    A100 at utilization 0.25: 5.01 GiB of KV) and one "FlashInfer is not available" (a Slurm
    pip install: 58.05 GiB): each within 0.5 GiB with the sampler its log names, and not with the
    other (Qwen2-7B's 152,064-entry vocabulary over 256 rows, Qwen3-4B's 151,936 over 1,024: 24 B a
    logit apart, 0.87 and 3.48 GiB)."""
    log = LOGS[log_id]
    kv = log["logged"]["available_kv_cache_gib"]

    def pool(flashinfer: bool) -> float:
        r = size(log["model"], gpu="A100-80GB" if "a100" in log_id else "H100-80GB", tokens=log["max_model_len"] or 40960,
                 gpu_memory_utilization=log["gpu_memory_utilization"] or 0.9, vllm_version=log["vllm_version"],
                 max_num_batched_tokens=log["max_num_batched_tokens"], flashinfer=flashinfer)
        return r.kv_pool_bytes / GiB

    assert abs(pool(log["flashinfer"]) - kv) <= 0.5
    assert abs(pool(not log["flashinfer"]) - kv) > 0.5


def test_a_pool_given_in_bytes_on_a_gpu_must_fit_beside_the_weights():
    """--kv-memory with --gpu is vLLM's --kv-cache-memory-bytes: the weights must load, the pool fit
    beside them, and max_model_len stay within the model's context."""
    from kvplan.model.gpus import get_gpu

    total = get_gpu("L40S").cuda_memory_bytes
    assert size("meta-llama/Llama-3.1-8B-Instruct", gpu="L40S", kv_memory="20GiB", tokens=8192).fits
    too_big = size("meta-llama/Llama-3.1-8B-Instruct", gpu="L40S", kv_memory=total, tokens=8192)
    assert not too_big.fits and too_big.reason.startswith("CUDA out of memory allocating the KV cache")
    heavy = size("meta-llama/Llama-3.1-70B-Instruct", gpu="L40S", kv_memory="10GiB", tokens=8192)
    assert not heavy.fits and heavy.reason.startswith("CUDA out of memory while loading the weights")
    long = size("meta-llama/Llama-3.1-8B-Instruct", gpu="L40S", kv_memory="20GiB", tokens=140_000)
    assert not long.fits and long.reason.startswith("User-specified max_model_len (140000)")
    assert size("meta-llama/Llama-3.1-8B-Instruct", gpu="L40S", kv_memory="20GiB", tokens=140_000,
                allow_long_max_model_len=True).fits


def test_a_hybrid_pool_without_a_gpu_names_the_chunk_its_concurrency_assumes():
    """gpt-oss-120b at TP4 on A100s (dennislee22's log, 0.10.1.1): a 45.32 GiB pool and "Maximum
    concurrency for 16,384 tokens per request: 284.25x" at the A100's 2,048-token chunk. Without a GPU
    the chunk is an assumption (8,192), which the note says, and the flag that sets it gives the log's
    figure."""
    from kvplan.model.size import size as size_run

    log = LOGS["gpt-oss-120b-4xa100-80gb-tp4-ray-gmu080-16k"]
    pool = int(log["logged"]["available_kv_cache_gib"] * GiB)
    run = size_run("openai/gpt-oss-120b", tp=4, kv_memory=pool, tokens=16384, max_num_batched_tokens=2048)
    assert run.report.vllm_concurrency == pytest.approx(log["logged"]["max_concurrency"], abs=0.01)
    assumed = size_run("openai/gpt-oss-120b", tp=4, kv_memory=pool, tokens=16384)
    assert any("Without a GPU the chunk is taken as 8,192" in n for n in assumed.notes)
    assert not any("Without a GPU" in n for n in run.notes)


def test_the_sampler_warm_up_after_the_kv_cache_can_run_short():
    """vLLM allocates the pool, captures the CUDA graphs (outside the pool before 0.20), then warms
    the sampler up with min(max_num_seqs, max_num_batched_tokens) dummy requests (gpu_worker.py,
    compile_or_warm_up_model). It has the activation the profile freed and the share the utilization
    leaves, less what was in use before the snapshot and the graphs: at 0.99 of an L4 (0.22 GiB
    left) that cannot hold the context and the graphs; at 0.90 (2.2 GiB) it can."""
    tight = size("meta-llama/Meta-Llama-3-8B", gpu="L4", tokens=8192, gpu_memory_utilization=0.99,
                 vllm_version="0.16")
    m = tight.memory_breakdown
    assert m["kv"] > 0 and not m["cuda_graphs_in_pool"]
    assert m["warmup"] <= m["activation"]  # the profile measured the same sampler pass
    assert tight.reason.startswith("CUDA out of memory occurred when warming up sampler with 256 dummy requests")
    assert not tight.fits
    roomy = size("meta-llama/Meta-Llama-3-8B", gpu="L4", tokens=8192, gpu_memory_utilization=0.90,
                 vllm_version="0.16")
    assert roomy.reason is None and roomy.fits
    assert roomy.memory_breakdown["free_after_sizing"] > roomy.memory_breakdown["warmup"]


@pytest.mark.parametrize("model", ["meta-llama/Meta-Llama-3-8B", "openai/gpt-oss-20b", "Qwen/Qwen3-30B-A3B",
                                   "google/gemma-3-27b-it"])
@pytest.mark.parametrize("seqs, tokens", [(1, 8192), (256, 2048), (1024, 8192), (4096, 2048)])
def test_the_warm_up_never_needs_more_than_the_profile_peak(model, seqs, tokens):
    m = size(model, gpu="H200", tokens=4096, max_num_seqs=seqs, max_num_batched_tokens=tokens).memory_breakdown
    assert 0 < m["warmup"] <= m["activation"]


@pytest.mark.parametrize("tp, communicator", [(1, 0), (2, 544 * 10**6), (4, 688 * 10**6), (8, 688 * 10**6)])
def test_tensor_parallel_ranks_count_one_nccl_communicator_in_the_profile_and_one_before(tp, communicator):
    """NCCL's own measurement of a communicator (NVIDIA/nccl#964): 544 MB over 2 GPUs, 688 MB over
    more; vLLM's profile sees the one built or connected inside it, and the one pynccl builds at init
    is in use before the snapshot, beside the CUDA context."""
    m = size("meta-llama/Llama-3.1-70B-Instruct", gpu="H100-80GB", tokens=8192, tp=tp).memory_breakdown
    assert m["non_torch"] == int(0.1 * GiB) + communicator
    assert m["before_profile"] == int(0.5 * GiB) + communicator


def test_llm_d_tp2_logs_state_the_non_torch_memory_of_one_communicator():
    """llm-d's two tp=2 H100 logs print 0.54 and 0.55 GiB of non-torch memory."""
    for log_id in ("llama33-70b-fp8-dynamic-2xh100-tp2-llmd-16k", "qwen3-32b-2xh100-tp2-llmd-16k"):
        logged = LOGS[log_id]["logged"]["non_torch_memory_gib"]
        m = size(LOGS[log_id]["model"], gpu="H100-80GB", tokens=16000, tp=2).memory_breakdown
        assert abs(m["non_torch"] / GiB - logged) <= 0.1, (log_id, logged)
