"""Fidelity of the step-time model: kvplan's serve engine against cited published measurements.

Reads tests/data/step_time_measurements.yaml (every number copied from its source) and, for each
measurement whose model resolves (the catalog, or a re-upload of a catalog model, as kvplan resolves it)
and whose GPU is in the GPU catalog, simulates the benchmark with kvplan's engine and compares:
- offline throughput (fixed lengths or ShareGPT-like, all requests at once): output tokens/s;
- latency (batch 1, one output token): TTFT;
- online runs (Poisson at the stated rate, or a burst, or a closed loop of N clients): TTFT,
  ITL/TPOT (per-request TPOT where the source prints it, else ITL), E2E and output throughput,
  mean or median as the source states.

How a benchmark is restated (the same for every case; nothing depends on the model or the GPU):
- KV pool: what vLLM allocates for the model on that GPU (kvplan/model/vllm_memory.py), at the
  benchmark's TP; TensorRT-LLM instead gives the KV cache a fraction of the memory left free
  (kv_cache_free_gpu_mem_fraction: 0.95 in trtllm-bench's perf pages, 0.9 by default), and admits a
  request only when its whole prompt + output can be reserved (GUARANTEED_NO_EVICT, its default
  capacity policy: kvplan's contiguous "oracle" reservation).
- Scheduler (engine_limits): vLLM V1's `vllm serve` defaults for the GPU; vLLM V0 releases (before
  0.8) their own (256 sequences, chunked prefill only past 32K of max_model_len, else
  max(max_model_len, 2048) batched tokens); TensorRT-LLM's trtllm-bench engine-build heuristics
  (tensorrt_llm/bench/build/tuning.py) or its build defaults (2048 requests, 8192 tokens); a stated
  max_num_seqs, batch size or max_model_len wins.
- A closed loop of N clients (--max-concurrency N) is N clients, each sending its next request when
  its answer is back: the sends are the answers of an engine capped at N (kvplan/calibrate/runs.py,
  run_benchmark), then run with the engine's own max_num_seqs; TTFT counts from the send, as the
  client measures it.
- ShareGPT lengths are lognormal (sigma 1.0, as workloads/kwon-sharegpt.yaml) and filtered as the
  benchmark clients filter ShareGPT (prompt <= 1024, prompt + output <= 2048, both >= 4 tokens),
  with the means the measurement's own totals imply (input = (total - output tokens/s) /
  requests/s, output = output tokens/s / requests/s), else 215 in / 194 out (the gpustack ShareGPT
  runs' means). A random dataset without --ignore-eos stops at the mean its totals imply (output
  tokens/s over requests/s, which needs no total); one whose lengths the source does not print has
  the lengths its totals imply.
- Prefix caching: on in vLLM V1 and SGLang (their defaults), off in vLLM V0; every prompt's blocks
  are its own (benchmark prompts share no prefix), so what it changes is preemption: a request
  preempted by recompute finds its freed prompt blocks still cached when it comes back.
- vLLM's engine: V0 for a release before 0.8, a later one run with VLLM_USE_V1=0, or a run that
  names no release but whose source is dated before 0.8.0 (source_date; vllm_v0); else V1.
- A client that sends a single prompt (num_prompts 1, whatever its rate) is a single request, not
  a burst (one_at_a_time).
- vLLM V0's multi-step scheduling (--num-scheduler-steps k) admits new requests only between windows
  of k decode steps: TTFT + (k - 1) / 2 x the predicted TPOT.
- SGLang's runs, by default, as vLLM would serve them (vLLM's pool, limits and scheduler, the
  SGLang factors below). With --sglang-own (values["_sglang"]) as SGLang runs them (sglang_setup):
  its start-up pool at the run's release (where it states none, the era its source's date allows:
  source_date, sglang_release), GPU, TP and stated --mem-fraction-static
  (kvplan/model/sglang_memory.py; slots = max_total_num_tokens, a hybrid SWA pool's smaller pool),
  its max_running_requests and
  chunked_prefill_size, --disable-radix-cache where stated, SGLang's scheduler (kvplan/sim/
  sglang.py); from v0.4 its overlap scheduler's extra step before a request is taken (overlap_lag)
  and, with prefill and decode in separate steps, a client's median inter-token gap that is a
  decode step alone (prefill_share). Not the default: bench/sglang_fidelity.py compares the two by
  regime and source, and SGLang's own rules do not yet beat vLLM's in every regime (closed-loop
  throughput and ITL, light-load TTFT). Models SGLang's engine is not modelled for (recurrent
  state) keep vLLM's restatement either way.
- sglang.bench_serving's random dataset in a closed loop: the lengths its seeded draw sent
  (bench_serving_random_lengths; the printed totals check it to the token). At a request rate a
  draw of kvplan's own (the client's Poisson arrivals, drawn after them, are not restated).
- A one-client run whose duration holds a cold start (cold_start: the printed mean TTFT over the
  median by more than a median request across its prompts) compares its medians, not its
  throughput (the client timed the warm-up).
- Runs with expert parallelism or attention data parallelism are skipped (kvplan splits experts by
  TP only).
- fp8 on a bf16 catalog checkpoint is vLLM's online fp8 (W8A8); "H100" without a form factor is
  the SXM part; engines' own CPU overheads differ (kvplan/model/step_time.ENGINE_OVERHEAD_FACTOR,
  by runtime: vLLM V0 apart from V1, each within FACTOR_PARAMS below), and so do the API servers
  in front of them (SERVER_FRONTEND_FACTOR, by the entry's `server`).
- E2E is the source's mean or median end-to-end latency, printed in seconds (`e2e_latency_s`) or
  in milliseconds (`e2e_ms`).

Validation is by source (source_group): every source's runs are predicted by constants fitted
on all the other sources (kvplan/calibrate/fit.py: leave_one_group_out), and reported per source
and per regime (REGIMES: single requests, light load under half the closed-form capacity, near
saturation, closed loops, offline tables, bursts) beside the previous default (OLD_DEFAULT) and
`timing: {model: roofline}`. All-at-once bursts are reported and never fitted: what a benchmark
client adds to a burst of 500-1,000 streaming requests (its own event loop's queue) is the
client's, not the server's. `--fit` refits the constants of kvplan/model/step_time.py
(PHYSICAL_RANGES) and the engine / server factors (FACTOR_PARAMS) on every run but the bursts and
prints them; the file then states them by hand. `--json FILE` writes the per-regime medians of
the shipped constants (tests/data/timing_fidelity_baseline.json, which a test keeps).

`--set NAME=VALUE` evaluates a candidate default (its constants instead of the shipped ones), `--fit-only
NAMES` refits only those constants. `--measured-hbm` evaluates the step model reading weights and KV
at the GPUs' measured achievable bandwidth (MEASURED_HBM: achievable_hbm on, with the constants
refitted for it) instead of the data sheet's; --set still applies on top of it.

Run: python bench/timing_fidelity.py [--fit [--fit-only NAMES]] [--quick] [--workers N] [--json FILE] [--sglang-own]
                                     [--measured-hbm] [--set NAME=VALUE ...]
"""

from __future__ import annotations

import math
import re
import zlib
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CORPUS = ROOT / "tests" / "data" / "step_time_measurements.yaml"
SHAREGPT_MEANS = (215, 194)
HASH_BLOCK = 16  # tokens per prefix-cache hash id (vLLM's block size)
SIGMA = 1.0
MAX_REQUESTS = 6000
GPU_PATTERNS = [  # first match wins: (regex on the source's GPU text, catalog name)
    (r"H100 NVL", None), (r"H200", "H200"), (r"H100.*PCIe", "H100-PCIe"), (r"H100", "H100-80GB"),
    (r"A100.*40", "A100-40GB"), (r"A100", "A100-80GB"), (r"L40S", "L40S"), (r"\bL4\b", "L4"),
    (r"RTX 4090", "RTX-4090"), (r"A10G", "A10G"), (r"MI300X", "MI300X"), (r"B200", "B200"),
]


# a run with expert parallelism or data-parallel attention, as its notes give the server's flags
EXPERT_PARALLEL = (r"--enable-expert-parallel|--enable-dp-attention|--ep(-size)?[ =]?([2-9]|\d\d)\b|"
                   r"attention_dp_size '?([2-9]|\d\d)|moe_ep_size '?([2-9]|\d\d)|expert[- ]parallel(ism)? "
                   r"(on|enabled)|with expert[- ]parallel")


def _gpu(text: str) -> str | None:
    for pattern, name in GPU_PATTERNS:
        if re.search(pattern, str(text), re.I):
            return name
    return None


def _spec_and_quant(model: str, quantization: str | None):
    from kvplan.errors import KvplanError
    from kvplan.model.resolve import load_spec

    try:  # re-uploads (nvidia/...-FP8) resolve as the catalog model they are, with their quantization
        spec = load_spec(model)
    except KvplanError:
        return None, None
    online = "fp8" if quantization == "fp8" and "quantization_config" not in spec.raw else None
    return spec, online


def implied_means(measured: dict) -> tuple[float | None, float | None]:
    """Mean input and output lengths a run's own totals imply: (total - output tokens/s) and output
    tokens/s over requests/s; None for a mean whose totals the run does not print (the output mean
    needs only output tokens/s and requests/s)."""
    total, out, rps = (measured.get(k) for k in ("total_tokens_per_s", "output_tokens_per_s", "requests_per_s"))
    if not (out and rps):
        return None, None
    return ((total - out) / rps if total else None), out / rps


def sharegpt_lengths(rng, n: int, mean_in: float, mean_out: float) -> tuple[np.ndarray, np.ndarray]:
    """ShareGPT-like lengths as the benchmark clients sample them: lognormal prompt and output
    lengths (sigma SIGMA), kept only where vLLM's and SGLang's samplers keep a conversation
    (vllm/benchmarks/datasets.py is_valid_sequence, the rule of benchmark_serving.py and of
    sglang.bench_serving: prompt and output >= 4 tokens, prompt <= 1024, prompt + output <= 2048),
    with their medians set so that the kept requests have the stated means."""
    z = rng.standard_normal((4 * n + 1000, 2))
    mu = np.log([mean_in, mean_out]) - SIGMA**2 / 2
    for _ in range(40):
        length = np.rint(np.exp(mu + SIGMA * z))
        p, o = length[:, 0], length[:, 1]
        keep = (p >= 4) & (o >= 4) & (p <= 1024) & (p + o <= 2048)
        p, o = p[keep][:n], o[keep][:n]
        step = np.log([mean_in / p.mean(), mean_out / o.mean()])
        mu += step
        if np.abs(step).max() < 1e-4:
            break
    return p.astype(np.int64), o.astype(np.int64)


BENCH_SERVING_SEED = 1  # sglang.bench_serving's --seed default: it seeds numpy's global generator with it


def bench_serving_random_lengths(input_len: int, output_len: int, ratio: float, n: int):
    """The prompt and output lengths of sglang.bench_serving's random dataset (sample_random_requests):
    numpy's global generator seeded with --seed (default 1, BENCH_SERVING_SEED), then n input lengths
    np.random.randint(max(int(input_len x ratio), 1), input_len + 1) and n output lengths the same
    way from output_len: the very lengths the benchmark sent, not a sample like them. Checked against
    the totals the runs print: at ratio 0.0, n = 10, 80, 500 and 320 give 6,101, 39,668, 249,831 and
    1,273,893 (input 8,000) input tokens and 4,220, 40,805, 252,662, 170,000 output tokens, as the
    SGLang cookbook's runs print them (those at 0.5.6 print n fewer output tokens: their release
    draws outputs from int(output_len x ratio) = 0, each one token shorter, which is not restated)."""
    draw = np.random.RandomState(BENCH_SERVING_SEED)
    prompt = draw.randint(max(int(input_len * ratio), 1), input_len + 1, size=n).astype(np.int64)
    output = draw.randint(max(int(output_len * ratio), 1), output_len + 1, size=n).astype(np.int64)
    return prompt, output


def _release(version) -> tuple[int, int] | None:
    match = re.match(r"v?(\d+)\.(\d+)", str(version or ""))
    return (int(match[1]), int(match[2])) if match else None


def trtllm_bench_limits(params: int, fp8_weights: bool, kv_bytes_per_token: int, memory_bytes: int, tp: int,
                        isl: int, osl: int, fraction: float = 0.95) -> tuple[int, int]:
    """max_batch_size and max_num_tokens that `trtllm-bench throughput` builds with
    (tensorrt_llm/bench/build/tuning.py, calc_engine_setting and finetune_setting): the requests
    of isl + osl tokens that `fraction` of the memory the weights leave holds, capped at 4,096, and
    that batch x (1 + isl / osl) tokens capped at 32,768, rounded up as the code rounds them."""
    engine = params / 1000**3 * (1 if fp8_weights else 2)
    available = memory_bytes / 1024**3 * tp - engine
    requests = available * fraction / (kv_bytes_per_token * tp / 1024**3) / (isl + osl)
    raw_bs = min(requests, 4096)
    raw_token = min(raw_bs * (1 + isl / osl), 32768)
    bs = max(64, _tiered_ceil(raw_bs, ((256, 32), (1024, 128)), 256))
    tokens = max(2048, _tiered_ceil(raw_token, ((4096, 256), (8192, 512)), 1024))
    return bs, tokens


def _tiered_ceil(x: float, tiers: tuple[tuple[float, int], ...], last: int) -> int:
    """x rounded up to a multiple of the step of the first tier whose bound it is below (else
    `last`), as tuning.py rounds batch sizes and token counts."""
    step = next((s for bound, s in tiers if x < bound), last)
    return step * math.ceil(x / step)


# vLLM 0.8.0, the release that made V1 the default engine (vllm-project/vllm#13726), was posted on
# 2025-03-18 ("vllm 0.8.0 is posted", verl-project/verl#650, 2025-03-19): a run that states no
# release but is dated before it (source_date) ran V0
VLLM_V1_DEFAULT_SINCE = "2025-03-18"


def vllm_v0(entry: dict) -> bool:
    """A vLLM release before 0.8 (V1 the default from 0.8.0), unless the run says it set VLLM_USE_V1;
    a later release run with VLLM_USE_V1=0 (V0 still selectable in those releases); a run that states
    no release but whose source is dated before 0.8.0 (source_date, VLLM_V1_DEFAULT_SINCE)."""
    if str(entry["engine"]) != "vllm":
        return False
    notes = str(entry.get("notes"))
    if re.search(r"VLLM_USE_V1=0", notes):
        return True
    release = _release(entry.get("engine_version"))
    if release is None:
        date = entry.get("source_date")
        return bool(date) and str(date) < VLLM_V1_DEFAULT_SINCE and not re.search(r"V1", notes)
    return release < (0, 8) and not re.search(r"V1", notes)


def runtime(entry: dict) -> str:
    """The engine's runtime, whose CPU overheads ENGINE_OVERHEAD_FACTOR scales: vLLM's V0 engine
    (before 0.8) is a different scheduler loop from V1's; TensorRT-LLM's PyTorch backend (the
    default of trtllm-serve and of the perf pages from v0.19, "Starting with v0.19, testing was
    performed using the PyTorch backend") runs its executor loop in Python, its older TensorRT
    engines in C++."""
    if vllm_v0(entry):
        return "vllm-v0"
    release = _release(entry.get("engine_version"))
    if str(entry["engine"]) == "tensorrt-llm" and (
            (release is not None and release >= (0, 19)) or re.search(r"PyTorch backend", str(entry.get("notes")))):
        return "tensorrt-llm-pytorch"
    return str(entry["engine"])


def engine_limits(entry: dict, spec, weights, layout, gpu, tp: int, mml: int):
    """(max_num_batched_tokens, max_num_seqs, chunked prefill, KV fraction of free memory or None
    for vLLM's own pool) of the engine as the measurement ran it, from what the source states and
    the engine's defaults for that release:
    - vLLM V1 (0.8 on, or VLLM_USE_V1=1): `vllm serve`'s defaults (kvplan/model/vllm_memory.py
      default_batch), chunked prefill on.
    - vLLM V0 (before 0.8): EngineArgs max_num_seqs 256; chunked prefill on by default only when
      max_model_len > 32,768 (vllm/engine/arg_utils.py, create_engine_config: use_long_context),
      and then 512 batched tokens, else max(max_model_len, 2048) (vllm/config.py SchedulerConfig).
    - TensorRT-LLM: a static batch as stated; `trtllm-bench throughput` builds with its own
      heuristics (trtllm_bench_limits) and a KV cache of 0.95 of the free memory (the perf-overview
      pages: "--kv_cache_free_gpu_mem_fraction 0.95" in many cases); served (Triton, trtllm-serve)
      with the build defaults, max_batch_size 2048 and max_num_tokens 8192 (BuildConfig), and
      kv_cache_free_gpu_mem_fraction 0.9 (KvCacheConfig's default). Chunked context is on.
    - SGLang and others: vLLM's V1 defaults (an approximation; SGLang's own: sglang_setup)."""
    from kvplan.model.vllm_memory import default_batch

    setup = entry["setup"]
    tokens, seqs = default_batch(gpu.name, gpu.cuda_memory_bytes)
    chunked, fraction = True, None
    engine = str(entry["engine"])
    if vllm_v0(entry):
        seqs, chunked = 256, mml > 32768
        tokens = 512 if chunked else max(mml, 2048)
    elif engine == "tensorrt-llm":
        seqs, tokens, fraction = 2048, 8192, 0.9
        if entry["kind"] == "offline_throughput" and setup.get("num_prompts") and not setup.get("batch_size"):
            fraction = 0.95
            fp8 = str(entry.get("quantization")) == "fp8"
            seqs, tokens = trtllm_bench_limits(weights.params, fp8, layout.bytes_per_token, gpu.cuda_memory_bytes,
                                               tp, setup["input_len"], setup["output_len"], fraction)
    seqs = setup.get("max_num_seqs") or setup.get("batch_size") or seqs  # a client's concurrency is the client's
    tokens = setup.get("max_num_batched_tokens") or tokens
    if not chunked:
        tokens = max(tokens, mml)
    return tokens, seqs, chunked, fraction


def reserve_whole(entry: dict) -> bool:
    """TensorRT-LLM's capacity scheduler (GUARANTEED_NO_EVICT) reserves a request's whole KV."""
    return str(entry["engine"]) == "tensorrt-llm"


def async_scheduling(entry: dict) -> bool:
    """Whether the engine core overlaps its host work with the GPU in that run: vLLM from
    SCHEDULER_ASYNC_FROM (kvplan/model/step_time.py), SGLang's overlap scheduler (its default from
    v0.4, "zero-overhead batch scheduler"), TensorRT-LLM's PyTorch backend (its overlap scheduler,
    "Enabled by default", docs/source/features/overlap-scheduler.md); the rest in series."""
    from kvplan.model.step_time import SCHEDULER_ASYNC_FROM

    release, rt = _release(entry.get("engine_version")), runtime(entry)
    if rt == "vllm":
        return release is not None and release >= SCHEDULER_ASYNC_FROM
    if rt == "sglang":
        return release is None or release >= (0, 4)
    return rt == "tensorrt-llm-pytorch"


# SGLang's server flags a run states in its notes (the launch command as the source quotes it); the
# client's flags (--max-concurrency, --request-rate ...) are the client's and read elsewhere
SGLANG_SERVER_FLAGS = {
    "mem_fraction_static": r"--mem-frac(?:tion-static)?[ =]([0-9]*\.?[0-9]+)",
    "chunked_prefill_size": r"--chunked-prefill-size[ =](-?\d+)",
    "max_running_requests": r"--max-running-requests[ =](\d+)",
    "schedule_conservativeness": r"--schedule-conservativeness[ =]([0-9]*\.?[0-9]+)",
}
# "SGLang as SGLang runs it" (sglang_setup) or as vLLM would (vLLM's pool, limits and scheduler: the
# restatement before SGLang's engine existed); values["_sglang"] picks one for a run
SGLANG_AS_SGLANG = False


def sglang_flags(entry: dict) -> dict:
    """The SGLang server flags stated in a run's notes: {field: value} of SGLANG_SERVER_FLAGS, and
    disable_radix_cache (--disable-radix-cache)."""
    notes = str(entry.get("notes"))
    out: dict = {}
    for name, pattern in SGLANG_SERVER_FLAGS.items():
        match = re.search(pattern, notes)
        if match:
            out[name] = float(match[1]) if "." in match[1] else int(match[1])
    out["disable_radix_cache"] = bool(re.search(r"--disable-radix-cache\b", notes))
    return out


def sglang_release(entry: dict) -> str:
    """The SGLang release whose start-up rules restate a run: the one it states, else the era its
    source's date allows (source_date: the commit that holds its output file; sglang_memory.release_at:
    a run made before a rule was merged cannot have run it), else the current rules."""
    from kvplan.model.sglang_memory import release_at

    return str(entry.get("engine_version") or release_at(entry.get("source_date")))


def sglang_setup(entry: dict, spec, layout, weights, gpu, tp: int, context: int, speculative_steps: int = 0):
    """SGLang's own start-up for a run (kvplan/model/sglang_memory.startup_memory) at the entry's
    release (sglang_release: the one stated, else the era of its source's date, else the current
    rules), GPU, TP and stated flags: (SglangConfig, pool slots = serving_tokens,
    SGLangMemory), or None where SGLang's engine is not modelled for the model (recurrent state:
    vLLM's restatement stays) or it would not start.
    The scheduler: SGLang's defaults for every release in the corpus (server_args.py: lpm,
    schedule_conservativeness 1.0, max_prefill_tokens 16384, the radix cache on), chunked_prefill_size
    by the GPU's memory (sglang_memory.batch_defaults), max_running_requests from the pool.
    `speculative_steps`: the same server drafting that many tokens (sglang_memory's rule 4: the
    pool's headroom and reserve), its running cap kept at the plain server's (a what-if of the same
    deployment with speculation, as a deployer that sets the cap runs it)."""
    from kvplan.errors import KvplanError
    from kvplan.model.sglang_memory import model_identity, startup_on
    from kvplan.workload.records import SglangConfig

    flags = sglang_flags(entry)
    server = dict(layout=layout, weights=weights.bytes_per_gpu(tp, gpu), tp=tp, context_len=context,
                  release=sglang_release(entry), mem_fraction_static=flags.get("mem_fraction_static"),
                  chunked_prefill_size=flags.get("chunked_prefill_size"), **model_identity(spec))
    try:
        m = startup_on(gpu, **server,
                       max_running_requests=entry["setup"].get("max_num_seqs") or flags.get("max_running_requests"))
    except KvplanError:
        return None
    if m.starts and speculative_steps:  # the same server speculating, its running cap the plain one's
        m = startup_on(gpu, **server, max_running_requests=m.max_running_requests, speculative_steps=speculative_steps)
    if not m.starts:
        return None
    chunk = m.chunked_prefill_size
    cfg = SglangConfig(schedule_conservativeness=float(flags.get("schedule_conservativeness", 1.0)),
                       chunked_prefill_size=0 if chunk == -1 else int(chunk),
                       max_running_requests=int(m.max_running_requests),
                       radix_cache=not flags["disable_radix_cache"])
    return cfg, int(m.serving_tokens), m


def sglang_restated(entry: dict) -> bool:
    """Whether SGLang's own rules (sglang_setup) restate this run, rather than vLLM's."""
    from kvplan.model.build import build_layout
    from kvplan.model.gpus import get_gpu
    from kvplan.model.weights import estimate_weights

    gpu_name = _gpu(entry["gpu"])
    spec, online = _spec_and_quant(entry["model"], entry.get("quantization"))
    if runtime(entry) != "sglang" or gpu_name is None or spec is None:
        return False
    tp = entry["tp"] or int((re.match(r"(\d+)x", str(entry["gpu"])) or [0, 1])[1])
    layout = build_layout(spec, "fp8" if entry.get("kv_cache_dtype") == "fp8" else "auto", tp)
    context = entry["setup"].get("max_model_len") or spec.max_context or 32768
    return sglang_setup(entry, spec, layout, estimate_weights(spec, online), get_gpu(gpu_name), tp, int(context)) is not None


def build_case(entry: dict, values: dict | None = None):
    """(workload, allocator, what to compare) for one measurement, or None when it cannot be run.
    `values`: the constants (StepConstants fields), the engine and server factors ("engine:NAME",
    "server:NAME"), and "_old" (every run in series: the structure before async scheduling) or
    "_roofline" (timing: {model: roofline}) to restate a run with the older models; "_mtp" (a
    what-if the benches print apart): the run drafting one MTP token a step, at kvplan's published
    MTP acceptance (kvplan/model/speculative.py), SGLang's runs on SGLang's speculative rules
    (kvplan/sim/sglang.py), vLLM's on vLLM's (the draft's KV sharing the pool)."""
    from kvplan.model.build import build_layout
    from kvplan.model.fit import size_model
    from kvplan.model.gpus import get_gpu
    from kvplan.model.step_time import (CONSTANTS, ENGINE_OVERHEAD_FACTOR, SERVER_FRONTEND_FACTOR, StepConstants,
                                        scale_overheads, step_model)
    from kvplan.model.vllm_memory import EngineOptions
    from kvplan.model.weights import engine_shape, estimate_weights
    from kvplan.workload.records import PoolSpec, SchedulerConfig, TimingConfig, Workload
    from kvplan.workload.spec import AllocatorSpec
    from kvplan.workload.chunks import RequestChunk

    gpu_name = _gpu(entry["gpu"])
    spec, online = _spec_and_quant(entry["model"], entry.get("quantization"))
    if gpu_name is None or spec is None:
        return None
    if re.search(EXPERT_PARALLEL, str(entry.get("notes")), re.I):
        return None  # expert parallelism is not modelled (kvplan splits MoE experts by TP)
    gpu = get_gpu(gpu_name)
    tp = entry["tp"] or int((re.match(r"(\d+)x", str(entry["gpu"])) or [0, 1])[1])
    setup, measured = entry["setup"], entry["measured"]
    weights = estimate_weights(spec, online)
    kv_dtype = "fp8" if entry.get("kv_cache_dtype") == "fp8" else "auto"
    layout = build_layout(spec, kv_dtype, tp)
    mml = setup.get("max_model_len") or min(spec.max_context or 32768,
                                            max(32768, (setup["input_len"] or 0) + (setup["output_len"] or 0) + 16))
    tokens, seqs, chunked, fraction = engine_limits(entry, spec, weights, layout, gpu, tp, mml)
    report = size_model(layout, tokens=mml, weight_bytes=weights.bytes, weight_bytes_per_gpu=weights.bytes_per_gpu(tp, gpu),
                        params=weights.params, gpu=gpu, engine="vllm",
                        engine_options=EngineOptions(max_num_batched_tokens=tokens, max_num_seqs=seqs),
                        engine_shape=engine_shape(spec))
    pool = report.kv_pool_bytes
    if fraction is not None and report.memory_breakdown:  # TensorRT-LLM: a fraction of what is free
        m = report.memory_breakdown
        pool = int(fraction * (m["total"] - m["weights"] - m["activation"] - m["non_torch"]))
    slots = pool // max(layout.bytes_per_token, 1)
    values = values or {}
    # SGLang's runs as SGLang runs them (values["_sglang"], default SGLANG_AS_SGLANG): its own pool,
    # running cap and chunk, and its scheduler (kvplan/sim/sglang.py); vLLM's restatement where
    # SGLang's engine is not modelled for the model
    sglang_own = None
    if (runtime(entry) == "sglang" and values.get("_sglang", SGLANG_AS_SGLANG) and not values.get("_roofline")
            and not values.get("_old")):
        sglang_own = sglang_setup(entry, spec, layout, weights, gpu, tp,
                                  int(setup.get("max_model_len") or spec.max_context or mml),
                                  speculative_steps=1 if values.get("_mtp") else 0)
    if sglang_own is not None:
        slots = sglang_own[1]
        # SGLang takes requests up to min(context_len, max_total_num_tokens) - 1 tokens (Scheduler's
        # max_req_len): a pool smaller than the context is served, not refused
        mml = min(mml, slots - 32)
        seqs, tokens = sglang_own[0].max_running_requests, sglang_own[0].chunked_prefill_size or max(mml, 8192)
    if slots < mml + 32:
        return None  # the model does not fit as restated
    names = set(StepConstants.__dataclass_fields__)
    c = replace(CONSTANTS, **{k: v for k, v in values.items() if k in names})
    factor = values.get("engine:" + runtime(entry), ENGINE_OVERHEAD_FACTOR.get(runtime(entry), 1.0))
    server = str(entry.get("server"))
    if sglang_own is not None:  # "sglang (image lmsysorg/sglang:...)" is SGLang's server too
        server = server.split(" (")[0]
    front = values.get("server:" + server, SERVER_FRONTEND_FACTOR.get(server, 1.0))
    if values.get("_old"):  # the structure before: intake and streaming scaled by the server's factor either way
        c = replace(c, step_overhead_s=c.step_overhead_s * factor, request_overhead_s=c.request_overhead_s * factor,
                    frontend_latency_s=c.frontend_latency_s * front, frontend_request_s=c.frontend_request_s * front,
                    stream_token_s=c.stream_token_s * front)
    else:
        c = scale_overheads(c, factor, front)
    overlap = async_scheduling(entry) and not values.get("_old")
    if values.get("_mtp") and sglang_own is not None:  # SGLang's EAGLE worker speculates without the
        overlap = False  # overlap scheduler (kvplan/sim/sglang.py)
    step = step_model(spec, layout, weights, gpu, tp, constants=c, async_scheduling=overlap)
    speculative = None
    if values.get("_mtp") and not values.get("_roofline"):
        from kvplan.model.speculative import draft_of, make_speculative
        from kvplan.workload.records import SpeculativeRun

        setting = make_speculative("mtp", 1)
        draft = draft_of(spec, layout, weights, step, setting)
        speculative = SpeculativeRun(setting, draft)
        if sglang_own is None:  # vLLM: the draft layer's KV in the same pool
            slots = pool // max(layout.bytes_per_token + draft.kv_bytes_per_token, 1)
    if values.get("_roofline"):
        timing = TimingConfig(gpu_name=gpu.name, hbm_bytes_per_s=gpu.hbm_bytes_per_s, peak_flops=gpu.peak_bf16_flops,
                              weight_bytes=weights.bytes_per_gpu(tp, gpu), flops_per_token=weights.flops_per_token / tp,
                              kv_bytes_per_token=layout.bytes_per_token, model="roofline")
    else:
        timing = TimingConfig(gpu_name=gpu.name, hbm_bytes_per_s=gpu.hbm_bytes_per_s,
                              peak_flops=gpu.peak_bf16_flops, step=step)
    rng = np.random.default_rng(zlib.crc32(entry["id"].encode()))
    n = min(setup.get("num_prompts") or setup.get("batch_size") or 500, MAX_REQUESTS)
    mean_in, mean_out = implied_means(measured)
    if setup["input_len"] and setup["output_len"] and setup.get("random_range_ratio") is not None:
        # sglang.bench_serving's random dataset, each length drawn from [max(1, L x ratio), L]: in a
        # closed loop (its sends follow the answers) the very lengths it sent; at a request rate its
        # Poisson arrivals come from the same seeded generator after them, which is not restated, so
        # such a run keeps a draw of its own for both (lengths alone would pair the client's lengths
        # with arrivals it never drew)
        r = setup["random_range_ratio"]
        if setup.get("max_concurrency") and not setup.get("request_rate"):
            prompt, output = bench_serving_random_lengths(setup["input_len"], setup["output_len"], r, n)
        else:
            prompt = rng.integers(max(1, int(setup["input_len"] * r)), setup["input_len"] + 1, n)
            output = rng.integers(max(1, int(setup["output_len"] * r)), setup["output_len"] + 1, n)
    elif setup["input_len"] and setup["output_len"]:
        prompt = np.full(n, setup["input_len"], dtype=np.int64)
        # `vllm bench serve --dataset-name random`'s output_len is what the client asked for; without
        # --ignore-eos a run stops earlier, and its own totals say how many tokens a request made
        stopped = str(setup.get("dataset")) == "random" and mean_out and mean_out < setup["output_len"]
        out_len = round(mean_out) if stopped else setup["output_len"]
        output = np.full(n, max(out_len, 1), dtype=np.int64)
    elif "sharegpt" not in str(setup.get("dataset")).lower() and mean_in:
        # a random dataset whose lengths the source leaves to the client's defaults: every prompt
        # has the same length, the stated one or else the totals' mean; outputs stop early (no
        # --ignore-eos) at their mean (a stated prompt length wins: the printed requests/s the
        # means divide by is rounded, 0.05 for 0.048)
        prompt = np.full(n, max(int(setup["input_len"] or round(mean_in)), 1), dtype=np.int64)
        output = np.full(n, max(int(round(mean_out)), 1), dtype=np.int64)
    else:
        prompt, output = sharegpt_lengths(rng, n, mean_in or SHAREGPT_MEANS[0], mean_out or SHAREGPT_MEANS[1])
    rate = setup.get("request_rate")
    concurrency = setup.get("max_concurrency")
    arrival = np.cumsum(rng.exponential(1 / rate, n)) if rate and not concurrency else np.zeros(n)
    # automatic prefix caching: on by default in vLLM V1 (enable_prefix_caching, from 0.8 and with
    # VLLM_USE_V1) and SGLang (its radix cache), off in vLLM V0. The benchmark prompts share no
    # prefix (ShareGPT conversations, random token ids), so each request's prompt blocks are its
    # own (unique hash ids); what caching changes is preemption: a request preempted by recompute
    # frees blocks that stay cached until reused, so its re-prefill finds them (vLLM's
    # KVCacheManager.get_computed_blocks) instead of recomputing the whole prompt.
    caching = runtime(entry) in ("vllm", "sglang") and not reserve_whole(entry)
    sched = SchedulerConfig(int(seqs), int(max(tokens, seqs)), int(mml), chunked, "recompute", 0, True, caching)
    # TensorRT-LLM's capacity scheduler (GUARANTEED_NO_EVICT, its default) admits a request only
    # when the KV of its whole prompt + max_tokens can be reserved: an exact reservation (kvplan's
    # contiguous "oracle"); vLLM and SGLang allocate as tokens come and preempt when full (paged)
    reserve = reserve_whole(entry)
    alloc = AllocatorSpec("contiguous", policy="oracle", max_len=int(mml)) if reserve else AllocatorSpec(
        "paged", block_size=16)

    hash_ids = None
    if caching:  # unique ids: request j's full prompt blocks are nobody else's
        starts = np.concatenate([[0], np.cumsum(prompt // HASH_BLOCK)])
        hash_ids = [tuple(range(int(a), int(b))) for a, b in zip(starts[:-1], starts[1:])]

    # "_sglang_scheduler": SGLang's runs scheduled as SGLang does (kvplan/sim/sglang.py; bench/
    # sglang_fidelity.py compares), its running cap the same max_num_seqs; off: vLLM's scheduler
    sglang = sglang_own[0] if sglang_own is not None else None
    if sglang is None and values.get("_sglang_scheduler") and runtime(entry) == "sglang":
        from kvplan.workload.records import SglangConfig

        sglang = SglangConfig(max_running_requests=int(seqs))  # SGLang's own chunk and prefill budgets

    def workload(times, max_num_seqs=None):
        s = sched if max_num_seqs is None else replace(sched, max_num_seqs=min(max_num_seqs, sched.max_num_seqs))
        g = sglang if sglang is None or max_num_seqs is None else replace(
            sglang, max_running_requests=min(max_num_seqs, sglang.max_running_requests))
        return Workload(entry["id"], str(CORPUS), 0, "serve", n, PoolSpec(int(slots), layout.bytes_per_token),
                        (alloc,), s, timing,
                        lambda: iter([RequestChunk(times, prompt, output, hash_ids, HASH_BLOCK if caching else 0)]),
                        layout=layout, sglang=g, speculative=speculative)  # the layout: vLLM's hybrid KV
        #   cache manager for windowed models

    return workload, arrival, alloc, int(concurrency or 0)


def run_case(entry: dict, values: dict | None = None):
    """The simulated run of one measurement (None when it cannot be run); closed loops as a fixed
    point of the engine (kvplan/calibrate/runs.run_benchmark)."""
    from kvplan.calibrate.runs import run_benchmark

    built = build_case(entry, values)
    if built is None:
        return None
    workload, arrival, alloc, clients = built
    return run_benchmark(workload, arrival, alloc, clients)


def overlap_lag(entry: dict, values: dict | None = None) -> bool:
    """Whether a run's requests wait one more step for SGLang's overlap scheduler (its default from
    v0.4, "zero-overhead batch scheduler"; async_scheduling): each pass of its event loop
    (managers/scheduler.py event_loop_overlap) receives new requests, schedules and launches batch
    k, and only then waits for batch k - 1's results, so batch k is queued on the GPU before a
    request that came during k - 1 can be scheduled: it runs in batch k + 1, a step later than the
    loop in series (event_loop_normal) would take it, and its later steps follow it (its E2E moves
    by the same step). An idle engine (one request at a time) takes it at once. Only where SGLang's
    own rules restate the run (sglang_setup): kvplan's SGLang scheduler runs in series; the step
    is a decode step, the run's mean TPOT less the prefill steps' share (prefill_share)."""
    values = values or {}
    setup = entry["setup"]
    single = entry["kind"] == "latency" or setup.get("max_concurrency") == 1 or setup.get("batch_size") == 1
    return (runtime(entry) == "sglang" and bool(values.get("_sglang", SGLANG_AS_SGLANG)) and not values.get("_old")
            and not values.get("_roofline") and async_scheduling(entry) and not single and sglang_restated(entry))


GAPS_WITH_PREFILL_MAX = 0.5  # past this share of token gaps holding a prefill step, the median gap holds one


def prefill_share(entry: dict, values: dict | None, r) -> tuple[float, float]:
    """(f, g) of a run SGLang's scheduler served, whose prefill and decode steps are separate
    (enable_mixed_chunk is off by default): f the share of the run's time in prefill steps (the
    step model's time of every request's prefill, in chunks of chunked_prefill_size, over the
    makespan), g the share of token gaps that hold one (each prefill step stops every running
    request once: about the prefill steps over the decode steps)."""
    from kvplan.model.step_time import prefill_pairs

    built = build_case(entry, values)
    workload = built[0](built[1])
    step, chunk = workload.timing.step, workload.sglang.chunked_prefill_size or 1 << 62
    prefill, pieces = 0.0, 0
    for prompt in next(iter(workload.make_requests())).prompt_len:
        done = 0
        while done < prompt:
            c = int(min(chunk, prompt - done))
            prefill += step.step_s(tokens=c, requests=1, kv_read=done, pairs=prefill_pairs(c, done))
            done, pieces = done + c, pieces + 1
    return min(prefill / max(r.makespan, 1e-9), 1.0), pieces / max(r.steps - pieces, 1)


def cold_start(entry: dict) -> bool:
    """Whether a run of one client (max_concurrency 1) holds a cold start in its duration: with one
    request at a time the benchmark's duration is the sum of its requests' latencies, so a mean TTFT
    over the median by more than a whole median request's E2E across the run's n prompts
    (n x (mean - median TTFT) > median E2E) is a wait no request's serving explains (the prompts are
    drawn up to the same stated length): the first request's warm-up (kernel compilation, tuning)
    the client timed. Its output throughput (tokens over that duration) is then the client's, not
    the server's, and is not compared; the medians are. Read where the run compares median TTFT and
    E2E and its notes quote the printed mean ("Mean TTFT (ms): X")."""
    m, setup = entry["measured"], entry["setup"]
    n, median_e2e = setup.get("num_prompts"), m.get("e2e_ms") or (m.get("e2e_latency_s") or 0) * 1e3
    if setup.get("max_concurrency") != 1 or not n or m.get("ttft_stat") != "median" or not median_e2e \
            or m.get("e2e_stat") != "median" or not m.get("ttft_ms"):
        return False
    printed = re.search(r"Mean TTFT \(ms\): ([0-9]+\.?[0-9]*)", str(entry.get("notes")))
    return bool(printed) and n * (float(printed[1]) - m["ttft_ms"]) > median_e2e


def predictions(entry: dict, values: dict | None = None) -> dict | None:
    """Metric -> (predicted, measured) for one measurement."""
    r = run_case(entry, values)
    if r is None:
        return None
    m = entry["measured"]
    out: dict = {}
    # SGLang's overlap scheduler: a request waits one more decode step (overlap_lag), the TPOT less
    # the prefill steps' share of the time (prefill_share)
    share, gaps = prefill_share(entry, values, r) if overlap_lag(entry, values) else (None, None)
    lag = r.tpot.mean * (1.0 - share) if share is not None else 0.0

    def stat(dist, which):
        return dist.p50 if which == "median" else dist.mean

    if m.get("output_tokens_per_s") and entry["kind"] != "latency" and not cold_start(entry):
        out["throughput"] = (r.throughput_tps, m["output_tokens_per_s"])
    if m.get("ttft_ms"):
        ttft = stat(r.ttft, m.get("ttft_stat"))
        steps = entry["setup"].get("num_scheduler_steps") or 1
        if steps > 1:  # vLLM V0 multi-step: a new request waits for the window of `steps` decode steps to end
            ttft += (steps - 1) / 2 * r.tpot.mean
        ttft += lag
        out["ttft"] = (ttft * 1e3, m["ttft_ms"])
    itl = m.get("tpot_ms") or m.get("itl_ms")  # per-request TPOT, what kvplan reports
    if itl and entry["kind"] != "latency":
        gap = stat(r.tpot, m.get("itl_stat"))
        if share is not None and not m.get("tpot_ms") and m.get("itl_stat") == "median" and gaps <= GAPS_WITH_PREFILL_MAX:
            # the client's median inter-token gap (sglang.bench_serving's "Median ITL"): with
            # separate prefill steps in a minority of the gaps, the median gap is a decode step
            # alone, the median TPOT less the prefill steps' share. (vLLM's mixed steps put a
            # prefill chunk into a decode step instead: its runs keep the TPOT.)
            gap = r.tpot.p50 * (1.0 - share)
        out["itl"] = (gap * 1e3, itl)
    e2e = m.get("e2e_latency_s") or (m["e2e_ms"] / 1e3 if m.get("e2e_ms") else None)  # printed in s or ms
    if e2e:
        out["e2e"] = (stat(r.e2e, m.get("e2e_stat")) + lag, e2e)
    return out


def closed_loop_entry(run_id: str, source: str, quote: str, engine: str, version: str | None, model: str, gpu: str,
                      tp: int, input_len: int, output_len: int, clients: int, ttft_ms: float, tpot_ms: float,
                      fp8: bool = False) -> dict:
    """A measurement of this bench's schema for a closed loop of `clients` at fixed lengths whose mean
    TTFT and TPOT are known and nothing else (aiconfigurator's silicon rows: bench/engine_pairs.py,
    bench/silicon_rows.py); `fp8`: an FP8 checkpoint (a bf16 catalog model takes vLLM's online fp8)
    with an FP8 KV cache."""
    return {
        "id": run_id, "source": source, "source_group": "aiconfigurator-silicon", "quote": quote,
        "engine": engine, "engine_version": version, "model": model, "gpu": gpu, "tp": tp, "pp": 1,
        "quantization": "fp8" if fp8 else None, "kv_cache_dtype": "fp8" if fp8 else None,
        "server": "vllm-openai" if engine == "vllm" else "sglang", "kind": "online", "notes": "",
        "client": {"load": "concurrency"},
        "setup": {"input_len": input_len, "output_len": output_len, "batch_size": None, "num_prompts": None,
                  "request_rate": None, "max_concurrency": clients, "dataset": "synthetic, fixed ISL/OSL",
                  "max_num_seqs": None, "max_num_batched_tokens": None},
        "measured": {"requests_per_s": None, "output_tokens_per_s": None, "total_tokens_per_s": None,
                     "e2e_latency_s": None, "e2e_stat": None, "ttft_ms": ttft_ms, "ttft_stat": None,
                     "itl_ms": None, "tpot_ms": tpot_ms, "itl_stat": None},
    }


def served_predictions(entry: dict, sets: dict | None = None) -> dict | None:
    """predictions() of a run as its engine serves it: an SGLang run by SGLang's own rules (its pool,
    scheduler and overlap lag, as `--engine sglang` serves it), a vLLM run by vLLM's; `sets`: constants
    and factors (shipped_values' names) to take instead of the shipped ones."""
    values = dict(sets or {})  # build_case takes what is not given from the shipped constants
    if runtime(entry) == "sglang":
        values["_sglang"] = True
    return predictions(entry, values or None)


def source_group(entry: dict) -> str:
    """Who measured a run: the entry's `source_group`, else the publisher of its source (a GitHub
    repository, or one issue or pull request there: different people; else the web site)."""
    if entry.get("source_group"):
        return str(entry["source_group"])
    url = str(entry["source"])
    m = re.match(r"https?://github\.com/([^/]+/[^/]+)(?:/(issues|pull)/(\d+))?", url)
    if m:
        return m[1] + (f"#{m[3]}" if m[3] else "")
    return re.sub(r"^www\.", "", url.split("/")[2])


def burst(entry: dict) -> bool:
    """An online run that sends every request at once (no rate, no concurrency limit), unless it
    sends one request only (one_at_a_time)."""
    setup = entry["setup"]
    return (entry["kind"] == "online" and not setup.get("request_rate") and not setup.get("max_concurrency")
            and not one_at_a_time(entry))


def one_at_a_time(entry: dict) -> bool:
    """A run of one request at a time: a latency benchmark, a client of one (max_concurrency 1), a
    batch of one, or a client that sends a single prompt (num_prompts 1, whatever its rate)."""
    setup = entry["setup"]
    return (entry["kind"] == "latency" or setup.get("max_concurrency") == 1 or setup.get("batch_size") == 1
            or setup.get("num_prompts") == 1)


REGIMES = ("single requests", "light load", "near saturation", "closed loops", "offline tables", "bursts")
LIGHT_LOAD = 0.5  # a rate under half of what the server sustains (closed form, steady_state)


def regime(entry: dict, values: dict | None = None) -> str:
    """Which regime a run is in: one request at a time; a rate under LIGHT_LOAD of the capacity the
    step model gives in closed form at `values` (cases() passes the shipped constants) (kvplan/model/step_time.steady_state),
    or above it; a closed loop of several clients; an offline table; an all-at-once burst."""
    setup = entry["setup"]
    if one_at_a_time(entry):
        return "single requests"
    if entry["kind"] == "offline_throughput":
        return "offline tables"
    if setup.get("max_concurrency"):
        return "closed loops"
    if not setup.get("request_rate"):
        return "bursts"
    capacity = closed_form_capacity(entry, values)
    return "light load" if capacity and setup["request_rate"] < LIGHT_LOAD * capacity else "near saturation"


def closed_form_capacity(entry: dict, values: dict | None = None) -> float | None:
    """Requests/s the restated server sustains in steady state, in closed form (None: cannot say)."""
    from kvplan.model.step_time import steady_state

    built = build_case(entry, values)
    if built is None:
        return None
    workload = built[0](built[1])
    chunk = next(iter(workload.make_requests()))
    s = workload.scheduler
    state = steady_state(workload.timing.step, float(np.mean(chunk.prompt_len)), float(np.mean(chunk.output_len)),
                         s.max_num_seqs, s.max_num_batched_tokens, workload.pool.slots)
    return state["requests_per_s"]


# -- the fit ---------------------------------------------------------------------------------------

# (low, high, prior) of each engine's host-time factor against vLLM V1's, from how each is built:
# vLLM V0 keeps scheduling, input preparation and output processing on the GPU's critical path,
# which V1 took off it (vLLM's V1 announcement, Jan 2025), so at least V1's; SGLang's scheduler is
# lighter ("zero-overhead batch scheduler", SGLang v0.4 release notes, Dec 2024) and TensorRT-LLM
# schedules in C++, so at most V1's. The API servers in front of the engines likewise
# (SERVER_FRONTEND_FACTOR in kvplan/model/step_time.py).
FACTOR_PARAMS = (("engine:vllm-v0", 1.0, 3.0), ("engine:sglang", 0.1, 1.0), ("engine:tensorrt-llm", 0.05, 1.0),
                 ("engine:tensorrt-llm-pytorch", 0.1, 1.0), ("server:sglang", 0.05, 12.0), ("server:triton", 0.05, 1.5))


# Constants taken from a measurement instead of the fit (kvplan/model/step_time.py says which):
# fitted, vLLM's API-server share was pulled to 35 ms by the runs of other servers, where vLLM's
# measured share is 4-12 ms.
MEASURED = ("frontend_latency_s",)


# The fused-MoE tile model (kvplan/model/step_time.py, fused_moe_stream_factor), not the default: the
# width term off and expert_tiles_per_unit as `--fit --fit-only expert_tiles_per_unit --set
# expert_half_width=0 --set expert_tiles_per_unit=1` fits it on every run but the bursts (objective
# 0.190, against 0.173 for the shipped width term; refitting bandwidth_efficiency, gemm_efficiency,
# attention_efficiency, layer_overhead_s and moe_layer_overhead_s with it moves none of them).
# `--set expert_half_width=0 --set expert_tiles_per_unit=1.94` prints its tables (step_time.py's
# docstring sums them up: better ITL and E2E, worse TTFT and offline throughput, held out by source);
# bench/sglang_fidelity.py --moe compares it by engine and GPU vendor.
TILE_MODEL = {"expert_half_width": 0.0, "expert_tiles_per_unit": 1.94}

# The step model reading weights and KV at the GPUs' measured achievable bandwidth (achievable_hbm,
# hbm_achievable_bytes_per_s in kvplan/model/gpus.json) instead of the data sheet's: `--fit --quick
# --fit-only bandwidth_efficiency,expert_half_width,layer_overhead_s,moe_layer_overhead_s --set
# achievable_hbm=1 --set bandwidth_efficiency=0.78` fits these on every run but the bursts (objective
# 0.1638); --measured-hbm evaluates it, bench/sglang_fidelity.py --moe --measured-hbm by engine and
# vendor. Not the default: held out by source (median |error| before -> after, throughput / E2E /
# TTFT / ITL) single requests 16.5/20.0/13.6/14.8 -> 9.2/11.4/15.7/12.2, light load 2.4/14.0/27.8/
# 14.7 -> 2.4/15.8/11.4/12.7, near saturation 5.1/54.0/48.2/49.6 -> 8.0/59.7/36.1/42.6, closed loops
# 15.3/16.6/38.3/19.0 -> 14.7/17.8/44.6/15.4, offline 19.6 -> 12.7, bursts 27.5 -> 38.4 (never
# fitted): it loses in four regimes. By engine and vendor (MoE runs, signed median): SGLang MI300X
# throughput +42.2% -> +30.0% (SGLang's own restatement +33.3 -> +21.8), its ITL -27.7 -> -26.5,
# SGLang NVIDIA ITL +20.0 -> +15.7, vLLM NVIDIA ITL +12.6 -> +10.0, but vLLM MI300X throughput
# -8.1 -> -13.3 and vLLM NVIDIA throughput +9.1 -> +10.2. MEASURED_HBM_TILES: the fused-MoE tile
# model on top of it (`--fit --quick --fit-only expert_tiles_per_unit --measured-hbm --set
# expert_half_width=0 --set expert_tiles_per_unit=1.94` refits the constant to 1.82, objective
# 0.1951): fitted on all it loses closed loops' throughput and E2E (13.7 -> 17.1%, 14.4 -> 18.2%)
# and single requests' TTFT (22.6 -> 32.9%), and the SGLang MI300X throughput (+57%), while it
# fixes NVIDIA's MoE ITL (SGLang -4.3%, vLLM +1.7%); held out by source (`--measured-hbm --set
# expert_half_width=0 --set expert_tiles_per_unit=1.82`) it is worse than the shipped model overall
# in throughput and TTFT (15.4 -> 18.0%, 33.0 -> 41.2%) and in offline tables (19.6 -> 32.4%):
# not the default either.
MEASURED_HBM = {"achievable_hbm": 1.0, "bandwidth_efficiency": 0.78, "layer_overhead_s": 5.18e-6,
                "moe_layer_overhead_s": 1.591e-5, "expert_half_width": 246.3}
MEASURED_HBM_TILES = {**MEASURED_HBM, "expert_half_width": 0.0, "expert_tiles_per_unit": 1.82}


def params(values: dict | None = None):
    """The fitted parameters: the step-time constants in their physical ranges, then the factors.
    Of the two expert-stream models only the one `values` (default: the shipped constants) has on
    is fitted: expert_tiles_per_unit where it is above 0, else expert_half_width."""
    from kvplan.calibrate.fit import Param
    from kvplan.model.step_time import CONSTANTS, PHYSICAL_RANGES

    tiles = (values or {}).get("expert_tiles_per_unit", CONSTANTS.expert_tiles_per_unit)
    off = "expert_half_width" if tiles > 0 else "expert_tiles_per_unit"
    # the opt-in constant's prior is the value it is switched on with (0, the shipped one, is "off")
    prior = {**CONSTANTS.to_dict(), "expert_tiles_per_unit": tiles}
    out = [Param(name, low, high, prior[name]) for name, (low, high) in PHYSICAL_RANGES.items()
           if name not in MEASURED and name != off]
    return out + [Param(name, low, high, 1.0) for name, low, high in FACTOR_PARAMS]


def shipped_values() -> dict:
    """The shipped constants and factors as one dict of parameter values."""
    from kvplan.model.step_time import CONSTANTS, ENGINE_OVERHEAD_FACTOR, SERVER_FRONTEND_FACTOR

    values = CONSTANTS.to_dict()
    values.update({f"engine:{k}": v for k, v in ENGINE_OVERHEAD_FACTOR.items()})
    values.update({f"server:{k}": v for k, v in SERVER_FRONTEND_FACTOR.items()})
    return values


# The default before this release (kvplan 0.1's, fitted on 114 cases with every third held out):
# every run in series, no fixed GPU time per layer, MoE routing or expert width.
OLD_DEFAULT = {"bandwidth_efficiency": 0.9, "gemm_efficiency": 0.75, "attention_efficiency": 0.5,
               "step_overhead_s": 1.75e-3, "request_overhead_s": 51e-6, "allreduce_latency_s": 27e-6,
               "link_efficiency": 0.69, "weight_only_gemm": 0.41, "frontend_latency_s": 41e-3,
               "frontend_request_s": 8e-3, "stream_token_s": 100e-6, "layer_overhead_s": 0.0,
               "moe_layer_overhead_s": 0.0, "expert_half_width": 0.0, "engine:vllm-v0": 2.0,
               "engine:sglang": 1.0, "engine:tensorrt-llm": 0.09, "engine:tensorrt-llm-pytorch": 0.61,
               "server:sglang": 0.59, "server:triton": 0.25, "achievable_hbm": 0.0, "_old": True}


def parse_sets(items: list[str], known=None) -> dict:
    """--set NAME=VALUE items as {name: float}; a name that is not in `known` (default: the
    step-time constants and factors this bench fits), or a value that is no number, stops the bench
    with a one-line error. bench/parallel_fidelity.py parses its --set with it too."""
    known = shipped_values() if known is None else known
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = None
        if name not in known or number is None or not math.isfinite(number):
            raise SystemExit(f"--set {item}: expected NAME=NUMBER with NAME one of {', '.join(sorted(known))}")
        out[name] = number
    return out


def _predict(entry: dict, values: dict):
    return predictions(entry, values)


def load_entries() -> list[dict]:
    return yaml.safe_load(CORPUS.read_text(encoding="utf-8"))["measurements"]


def cases(entries: list[dict]):
    """The corpus as fit cases: grouped by source, with their regime; bursts are never fitted (what
    the benchmark client adds to an all-at-once burst is the client's, not the server's)."""
    from kvplan.calibrate.fit import Case

    reference = shipped_values()
    out = []
    for e in entries:
        if build_case(e) is None:
            continue
        r = regime(e, reference)
        out.append(Case(e["id"], source_group(e), r, _predict, e, fitted=r != "bursts"))
    return out


def table(title: str, columns: dict[str, list[dict]], picks: dict[str, list[bool]]) -> list[str]:
    """Lines of a table: one row per pick, for each column the median |error| per metric."""
    from kvplan.calibrate.fit import METRICS, medians

    lines = [f"{title}", f"{'':34}" + "".join(f"| {name:^33}" for name in columns)]
    lines.append(f"{'':34}" + "| thr     E2E     TTFT    ITL      " * len(columns))
    for row, pick in picks.items():
        cells = []
        for errs in columns.values():
            med = medians(errs, pick)
            cells.append("| " + " ".join(f"{med[m][0]:6.1%} " if m in med else "   -    " for m in METRICS))
        n = sum(pick)
        lines.append(f"{row[:28]:28} {n:4}  " + "".join(cells))
    return lines


def main() -> None:
    import argparse
    import json

    from kvplan.calibrate.fit import errors, fit, leave_one_group_out, linearize, run_cases

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="refit the constants on the whole corpus (bursts left out)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="the shipped default and the old one only, no leave-one-out")
    ap.add_argument("--json", type=Path, help="write the per-regime medians here (the test's baseline)")
    ap.add_argument("--sglang-own", action="store_true",
                    help="restate SGLang's runs by SGLang's own rules (sglang_setup; bench/sglang_fidelity.py compares)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="evaluate (and fit from) these constants instead of the shipped ones (repeatable): a "
                         "candidate default, e.g. expert_half_width=0 expert_tiles_per_unit=1")
    ap.add_argument("--measured-hbm", action="store_true",
                    help="read weights and KV at the GPUs' measured achievable bandwidth (MEASURED_HBM, before --set)")
    ap.add_argument("--fit-only", metavar="NAMES",
                    help="with --fit: refit only these constants (comma-separated), the rest as shipped or --set")
    args = ap.parse_args()
    if args.sglang_own:
        global SGLANG_AS_SGLANG
        SGLANG_AS_SGLANG = True
    entries = load_entries()
    all_cases = cases(entries)
    progress = lambda msg: print("  ..", msg, flush=True)  # noqa: E731
    values = {**shipped_values(), **(MEASURED_HBM if args.measured_hbm else {}), **parse_sets(args.set)}
    prm = params(values)
    if args.fit:
        fitted = prm
        if args.fit_only:
            names = set(args.fit_only.split(","))
            fitted = [p for p in prm if p.name in names]
            if len(fitted) != len(names):
                ap.error(f"--fit-only: expected fitted constants of {', '.join(p.name for p in prm)}")
        values, rows, score = fit(all_cases, fitted, values, iterations=4, workers=args.workers, progress=progress)
        print("fitted:", json.dumps({k: float(f"{v:.4g}") for k, v in values.items() if not k.startswith("_")}))
    columns = {"old default (as shipped)": errors(run_cases(all_cases, OLD_DEFAULT, args.workers)),
               "roofline": errors(run_cases(all_cases, {"_roofline": True}, args.workers))}
    new = errors(run_cases(all_cases, values, args.workers))
    if not args.quick:
        rows = linearize(all_cases, prm, values, args.workers, progress)
        columns["new default, leave-one-source-out"] = leave_one_group_out(all_cases, prm, values, rows, args.workers)
    columns["new default (fitted on all)"] = new
    for c, errs in zip(all_cases, new):
        cells = "  ".join(f"{k} {v:+.0%}" for k, v in errs.items())
        print(f"{c.id[:46]:46} {c.group[:22]:22} {c.regime[:15]:15} {cells}")
    fitted = [c.fitted for c in all_cases]
    overall = {"all but bursts": fitted, "all": [True] * len(all_cases)}
    by_regime = {r: [c.regime == r for c in all_cases] for r in REGIMES}
    groups = sorted({c.group for c in all_cases})
    by_source = {g: [c.group == g for c in all_cases] for g in groups}
    engines = sorted({runtime(c.arg) for c in all_cases})
    by_engine = {e: [runtime(c.arg) == e and c.fitted for c in all_cases] for e in engines}
    for line in table("\nmedian |error| overall", columns, overall) + table("\nper regime", columns, by_regime) \
            + table("\nper engine (bursts left out)", columns, by_engine) + table("\nper source", columns, by_source):
        print(line)
    print(f"\n{len(all_cases)} runs of {len(entries)} restated, {len(groups)} sources; bursts are reported, never "
          "fitted. Leave-one-source-out: each source's runs simulated with constants fitted on the other sources "
          "(on the engine's linear model around the shipped constants; kvplan/calibrate/fit.py).")
    if args.json:
        from kvplan.calibrate.fit import medians

        doc = {r: {m: round(v, 4) for m, (v, _) in medians(new, pick).items()} for r, pick in by_regime.items()}
        args.json.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
