"""Fidelity of the step-time model: kvplan's serve engine against cited published measurements.

Reads tests/data/step_time_measurements.yaml (every number copied from its source) and, for each
measurement whose model resolves (the catalog, or a re-upload of a catalog model, as kvplan resolves it)
and whose GPU is in the GPU catalog, simulates the benchmark with kvplan's engine and compares:
- offline throughput (fixed lengths or ShareGPT-like, all requests at once): output tokens/s;
- latency (batch 1, one output token): TTFT;
- online runs (Poisson at the stated rate, or a burst, or a closed loop of N clients): TTFT,
  ITL/TPOT, E2E and output throughput, mean or median as the source states.

How a benchmark is restated (the same for every case; nothing depends on the model or the GPU):
- KV pool: what vLLM allocates for the model on that GPU (kvplan/model/vllm_memory.py), at the
  benchmark's TP; scheduler: vLLM V1's defaults for the GPU (chunked prefill, vllm serve's batch
  limits), or max_num_seqs = the stated batch size / client concurrency.
- A closed loop of N clients is N requests in flight: all arrive at once with max_num_seqs N,
  and TTFT is counted from admission (a client sends when the previous answer is done).
- ShareGPT lengths are lognormal (sigma 1.0, as workloads/kwon-sharegpt.yaml) with the means the
  measurement's own totals imply (input = (total - output tokens/s) / requests/s, output =
  output tokens/s / requests/s), else 215 in / 194 out (the gpustack ShareGPT runs' means).
- Runs with expert parallelism are skipped (kvplan splits experts by TP only).
- fp8 on a bf16 catalog checkpoint is vLLM's online fp8 (W8A8); "H100" without a form factor is
  the SXM part; engines' own CPU overheads differ (kvplan/model/step_time.ENGINE_OVERHEADS).

The corpus is split once, by position in the file: every third measurement (index % 3 == 2) is
held out of fitting. `--fit` searches the global constants of kvplan/model/step_time.py on the
fitted part (coordinate descent on the mean over metrics of the median |log(predicted /
measured)|) and prints them; the file then states them by hand.

Run: python bench/timing_fidelity.py [--fit]
"""

from __future__ import annotations

import math
import re
import zlib
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CORPUS = ROOT / "tests" / "data" / "step_time_measurements.yaml"
SHAREGPT_MEANS = (215, 194)
SIGMA = 1.0
MAX_REQUESTS = 6000  # longer benchmarks are cut to their first 6,000 requests (steady state by then)
GPU_PATTERNS = [  # first match wins: (regex on the source's GPU text, catalog name)
    (r"H100 NVL", None), (r"H200", "H200"), (r"H100.*PCIe", "H100-PCIe"), (r"H100", "H100-80GB"),
    (r"A100.*40", "A100-40GB"), (r"A100", "A100-80GB"), (r"L40S", "L40S"), (r"\bL4\b", "L4"),
    (r"RTX 4090", "RTX-4090"), (r"A10G", "A10G"), (r"MI300X", "MI300X"), (r"B200", "B200"),
]


def held_out(index: int) -> bool:
    return index % 3 == 2


def _gpu(text: str) -> str | None:
    for pattern, name in GPU_PATTERNS:
        if re.search(pattern, str(text)):
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


def build_case(entry: dict, constants=None, factors=None):
    """(workload, allocator, what to compare) for one measurement, or None when it cannot be run."""
    from kvplan.model.build import build_layout
    from kvplan.model.fit import size_model
    from kvplan.model.gpus import get_gpu
    from kvplan.model.step_time import CONSTANTS, ENGINE_OVERHEAD_FACTOR, step_model
    from kvplan.model.vllm_memory import EngineOptions, default_batch
    from kvplan.model.weights import engine_shape, estimate_weights
    from kvplan.workload.records import (AllocatorSpec, PoolSpec, RequestChunk, SchedulerConfig,
                                         TimingConfig, Workload)

    gpu_name = _gpu(entry["gpu"])
    spec, online = _spec_and_quant(entry["model"], entry.get("quantization"))
    if gpu_name is None or spec is None:
        return None
    if re.search(r"expert[- ]parallel", str(entry.get("notes")), re.I):
        return None  # expert parallelism is not modelled (kvplan splits MoE experts by TP)
    gpu = get_gpu(gpu_name)
    tp = entry["tp"] or int((re.match(r"(\d+)x", str(entry["gpu"])) or [0, 1])[1])
    setup, measured = entry["setup"], entry["measured"]
    weights = estimate_weights(spec, online)
    kv_dtype = "fp8" if entry.get("kv_cache_dtype") == "fp8" else "auto"
    layout = build_layout(spec, kv_dtype, tp)
    tokens, seqs = default_batch(gpu.name, gpu.cuda_memory_bytes)
    seqs = setup.get("max_num_seqs") or setup.get("batch_size") or setup.get("max_concurrency") or seqs
    tokens = setup.get("max_num_batched_tokens") or tokens
    mml = min(spec.max_context or 32768, max(32768, (setup["input_len"] or 0) + (setup["output_len"] or 0) + 16))
    report = size_model(layout, tokens=mml, weight_bytes=weights.bytes, weight_bytes_per_gpu=weights.bytes_per_gpu(tp),
                        params=weights.params, gpu=gpu, engine="vllm",
                        engine_options=EngineOptions(max_num_batched_tokens=tokens, max_num_seqs=seqs),
                        engine_shape=engine_shape(spec))
    slots = report.kv_pool_bytes // max(layout.bytes_per_token, 1)
    if slots < mml + 32:
        return None  # the model does not fit as restated
    c = constants or CONSTANTS
    factor = (factors or ENGINE_OVERHEAD_FACTOR).get(str(entry["engine"]), 1.0)
    c = replace(c, step_overhead_s=c.step_overhead_s * factor, request_overhead_s=c.request_overhead_s * factor,
                frontend_latency_s=c.frontend_latency_s * factor, frontend_request_s=c.frontend_request_s * factor)
    step = step_model(spec, layout, weights, gpu, tp, constants=c)
    timing = TimingConfig(gpu_name=gpu.name, hbm_bytes_per_s=gpu.hbm_bytes_per_s, peak_flops=gpu.peak_bf16_flops,
                          step=step)
    rng = np.random.default_rng(zlib.crc32(entry["id"].encode()))
    n = min(setup.get("num_prompts") or setup.get("batch_size") or 500, MAX_REQUESTS)
    if setup["input_len"] and setup["output_len"]:
        prompt = np.full(n, setup["input_len"], dtype=np.int64)
        output = np.full(n, setup["output_len"], dtype=np.int64)
    else:
        mean_in, mean_out = SHAREGPT_MEANS
        if measured.get("total_tokens_per_s") and measured.get("output_tokens_per_s") and measured.get("requests_per_s"):
            mean_out = measured["output_tokens_per_s"] / measured["requests_per_s"]
            mean_in = (measured["total_tokens_per_s"] - measured["output_tokens_per_s"]) / measured["requests_per_s"]
        mu = lambda m: math.log(m) - SIGMA**2 / 2  # noqa: E731
        prompt = np.clip(np.rint(rng.lognormal(mu(mean_in), SIGMA, n)), 4, mml // 2).astype(np.int64)
        output = np.clip(np.rint(rng.lognormal(mu(mean_out), SIGMA, n)), 1, mml // 2).astype(np.int64)
    rate = setup.get("request_rate")
    closed = bool(setup.get("max_concurrency"))
    arrival = np.cumsum(rng.exponential(1 / rate, n)) if rate and not closed else np.zeros(n)
    sched = SchedulerConfig(int(seqs), int(max(tokens, seqs)), int(mml), True, "recompute", 0, True)
    alloc = AllocatorSpec("paged", block_size=16)
    wl = Workload(entry["id"], str(CORPUS), 0, "serve", n, PoolSpec(int(slots), layout.bytes_per_token), (alloc,),
                  sched, timing, lambda: iter([RequestChunk(arrival, prompt, output)]))
    return wl, alloc, closed


def predictions(entry: dict, constants=None, factors=None) -> dict | None:
    """Metric -> (predicted, measured) for one measurement."""
    from kvplan.sim.engine import simulate

    built = build_case(entry, constants, factors)
    if built is None:
        return None
    wl, alloc, closed = built
    r = simulate(wl, alloc)
    m = entry["measured"]
    out: dict = {}

    def stat(dist, which):
        return dist.p50 if which == "median" else dist.mean

    if m.get("output_tokens_per_s") and entry["kind"] != "latency":
        out["throughput"] = (r.throughput_tps, m["output_tokens_per_s"])
    if m.get("ttft_ms"):
        ttft = stat(r.ttft, m.get("ttft_stat"))
        if closed:  # a client sends when its previous answer is done: no queue before admission
            ttft -= stat(r.queue_delay, m.get("ttft_stat"))
        out["ttft"] = (ttft * 1e3, m["ttft_ms"])
    itl = m.get("tpot_ms") or m.get("itl_ms")  # per-request TPOT, what kvplan reports
    if itl and entry["kind"] != "latency":
        out["itl"] = (stat(r.tpot, m.get("itl_stat")) * 1e3, itl)
    if m.get("e2e_latency_s"):
        out["e2e"] = (stat(r.e2e, m.get("e2e_stat")), m["e2e_latency_s"])
    return out


def evaluate(entries, constants=None, verbose=False, factors=None, all_parts=None) -> dict:
    """Errors per part and metric; the held-out part only when reporting (never while fitting)."""
    errs = {part: {k: [] for k in ("throughput", "e2e", "ttft", "itl")} for part in ("fitted", "held out")}
    all_parts = verbose if all_parts is None else all_parts
    for i, e in entries:
        if held_out(i) and not all_parts:
            continue  # fitting never looks at the held-out part
        got = predictions(e, constants, factors)
        if not got:
            continue
        part = "held out" if held_out(i) else "fitted"
        for metric, (pred, meas) in got.items():
            errs[part][metric].append(pred / meas - 1)
        if verbose:
            cells = "  ".join(f"{k} {p:,.4g}/{q:,.4g} ({p / q - 1:+.0%})" for k, (p, q) in got.items())
            print(f"{e['id'][:40]:40} {part:8} {cells}")
    return errs


def score(errs: dict, part: str = "fitted") -> float:
    meds = [statistics.median(abs(math.log1p(x)) for x in v) for v in errs[part].values() if v]
    return sum(meds) / len(meds)


def report(errs: dict) -> None:
    for part in ("fitted", "held out"):
        cells = []
        for metric, v in errs[part].items():
            if v:
                cells.append(f"{metric} {statistics.median(abs(x) for x in v):.1%} over {len(v)}")
        print(f"{part:>8}: median |error| " + ", ".join(cells))


def fit(entries) -> None:
    from kvplan.model.step_time import CONSTANTS

    grid = {
        "bandwidth_efficiency": [0.6, 0.7, 0.8, 0.85, 0.9],
        "gemm_efficiency": [0.5, 0.6, 0.7, 0.8, 0.9],
        "gemm_half_tokens": [16.0, 48.0, 96.0, 192.0, 384.0],
        "attention_efficiency": [0.25, 0.35, 0.45, 0.6, 0.75],
        "step_overhead_s": [0.5e-3, 1e-3, 2e-3, 3e-3, 5e-3],
        "request_overhead_s": [0.0, 5e-6, 15e-6, 30e-6, 60e-6],
        "allreduce_latency_s": [4e-6, 8e-6, 12e-6, 20e-6, 40e-6],
        "link_efficiency": [0.4, 0.55, 0.7, 0.85],
        "weight_only_gemm": [0.2, 0.35, 0.5, 0.7, 1.0],
        "frontend_latency_s": [0.0, 5e-3, 10e-3, 20e-3, 40e-3],
        "frontend_request_s": [0.0, 0.5e-3, 1e-3, 2e-3, 4e-3, 8e-3],
    }
    from kvplan.model.step_time import ENGINE_OVERHEAD_FACTOR

    best, factors = CONSTANTS, dict(ENGINE_OVERHEAD_FACTOR)
    best_score = score(evaluate(entries, best, factors=factors))
    for sweep in range(2):
        for key, values in grid.items():
            for v in values:
                trial = replace(best, **{key: v})
                s = score(evaluate(entries, trial, factors=factors))
                if s < best_score - 1e-9:
                    best, best_score = trial, s
            print(f"sweep {sweep} {key}: {getattr(best, key)} (score {best_score:.4f})", flush=True)
        for engine in ("sglang", "tensorrt-llm", "other"):
            for v in (0.1, 0.25, 0.5, 0.75, 1.0):
                trial = {**factors, engine: v}
                s = score(evaluate(entries, best, factors=trial))
                if s < best_score - 1e-9:
                    factors, best_score = trial, s
            print(f"sweep {sweep} factor {engine}: {factors[engine]} (score {best_score:.4f})", flush=True)
    print("fitted constants:", best)
    print("engine overhead factors:", factors)


def main() -> None:
    entries = list(enumerate(yaml.safe_load(CORPUS.read_text(encoding="utf-8"))["measurements"]))
    if "--fit" in sys.argv:
        fit(entries)
        return
    errs = evaluate(entries, verbose=True)
    report(errs)


if __name__ == "__main__":
    main()
