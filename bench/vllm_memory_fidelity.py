"""Fidelity: kvplan's prediction of vLLM's start-up memory against cited real start-up logs.

Reads tests/data/vllm_startup_logs.yaml (every number copied from the cited source) and, for
each log whose model is in the bundled catalog (or is a published quantized checkpoint of a
catalog model, with its published `quantization_config` below) and whose GPU is in the GPU
catalog, predicts:
- "Model loading took" (weights per GPU): target within 3%;
- "Available KV cache memory" (V1 logs only; V0 profiled differently): target within
  max(5%, 1 GiB);
- the start/fail verdict, when the log shows enough settings to decide it.
Logs of several GPUs whose split is not stated, and data- or expert-parallel runs (more GPUs
than TP x PP), are skipped: kvplan models tensor parallelism only. A setting the log does not
state takes vLLM's default (the utilization of the log's release,
max_model_len the model's context, the batch defaults of `vllm serve`). Each log is predicted
with the rules of the release it states (and, in 0.9-0.11.0, the sampler its log says it uses:
`flashinfer`; an MXFP4 checkpoint's experts, the kernels its log names: `mxfp4_backend`); a log
that states none takes the rules of 0.16 (PRE_PROFILED_GRAPHS).

The corpus is held out by source (`source_group`, else the thread or page): a third of the
sources it predicts, those of the lowest hash of their name among the sources no constant of
vllm_memory.py was checked on (CALIBRATION), is held out; the rest is the "fit" part. Prints one line per log, the
median absolute errors, and the share of cases that hold the issue's targets (weights within 5%,
KV within max(10%, 0.5 GiB), tokens and concurrency within 10%, the verdict exact) per part, per
release and per cause.

Run: python bench/vllm_memory_fidelity.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from kvplan.errors import KvplanError  # noqa: E402
from kvplan.model.vllm_memory import release_number  # noqa: E402

LOGS = ROOT / "tests" / "data" / "vllm_startup_logs.yaml"
GiB = 2**30
# Published quantized checkpoints of catalog models: (catalog model, quantization_config as the
# checkpoint's config.json publishes it).
CHECKPOINTS = {
    "Qwen/Qwen2.5-72B-Instruct-GPTQ-Int4": ("Qwen/Qwen2.5-72B-Instruct",
                                            {"quant_method": "gptq", "bits": 4, "group_size": 128,
                                             "desc_act": False, "sym": True}),
    # Same shapes as Qwen3-30B-A3B (hub config.json of both: 48 layers, 128 experts, top-8, hidden
    # 2048, 4 KV heads); only the context differs, and the log states its max_model_len.
    "Qwen/Qwen3-Coder-30B-A3B-Instruct": ("Qwen/Qwen3-30B-A3B", None),
    "Qwen/Qwen3-235B-A22B-FP8": ("Qwen/Qwen3-235B-A22B",
                                 {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128]}),
}
# GPU text as the logs write it -> catalog name. GCE's a2-highgpu-1g is one A100 40GB
# (https://cloud.google.com/compute/docs/gpus#a100-gpus).
GPU_NAMES = {"A100 (memory": "A100-80GB", "A100 (GCE a2-highgpu-1g": "A100-40GB", "L40S (46 GB": "L40S"}
# Failures no model of the engine can predict: memory other processes held at start-up.
EXTERNAL = ("Free memory on device",)
# The rules for a log that states no release: 0.16, the last release before the Triton sampler
# (0.17) and profiled CUDA graphs (0.20), whose rules held from 0.11.1 (FlashInfer's sampler off by
# default) on; the dated ones among those logs, llm-d's document of January 2026 on
# vllm/vllm-openai:latest, are from that span.
PRE_PROFILED_GRAPHS = "0.16"


def predict(entry: dict):
    from kvplan.errors import KvplanError
    from kvplan.model.build import build_layout
    from kvplan.model.fit import size_model
    from kvplan.model.gpus import get_gpu
    from kvplan.model.quant import ONLINE
    from kvplan.model.vllm_memory import EngineOptions
    from kvplan.model.weights import engine_shape, estimate_weights

    name = entry["model"]
    if (entry.get("pp") or 1) > 1:
        return None  # pipeline parallelism is not modelled yet
    gpus = entry.get("gpu_count") or 1
    if (entry["tp"] is None and gpus > 1) or gpus > (entry["tp"] or 1):
        return None  # the split over GPUs is not stated, or data/expert parallelism (not modelled)
    spec = spec_of(name)
    if spec is None:
        return None
    try:
        gpu_text = str(entry["gpu"] or "")
        gpu = get_gpu(next((v for k, v in GPU_NAMES.items() if gpu_text.startswith(k)), gpu_text))
    except KvplanError:
        return None
    tp = entry["tp"] or 1
    # vLLM's online --quantization (fp8) of a checkpoint that has no quantization_config of its own
    online = entry.get("quantization") if entry.get("quantization") in ONLINE \
        and not isinstance(spec.raw.get("quantization_config"), dict) else None
    weights = estimate_weights(spec, online)
    layout = build_layout(spec, entry.get("kv_cache_dtype") or "auto", tp)
    report = size_model(layout, tokens=entry["max_model_len"] or spec.max_context or 8192,
                        weight_bytes=weights.bytes, weight_bytes_per_gpu=weights.bytes_per_gpu(tp, gpu, entry.get("mxfp4_backend") or "auto"),
                        params=weights.params, gpu=gpu, engine="vllm",
                        engine_options=EngineOptions(
                            gpu_memory_utilization=entry["gpu_memory_utilization"] or 0.9,
                            max_num_batched_tokens=entry["max_num_batched_tokens"],
                            max_num_seqs=entry["max_num_seqs"],
                            enforce_eager=bool(entry["enforce_eager"]),
                            release=entry.get("vllm_version") or PRE_PROFILED_GRAPHS,
                            flashinfer=entry.get("flashinfer", True)),
                        engine_shape=engine_shape(spec))
    return report


def spec_of(name: str):
    from kvplan.errors import KvplanError
    from kvplan.model.config import read_model
    from kvplan.model.resolve import load_spec

    try:
        if name in CHECKPOINTS:
            base, quant = CHECKPOINTS[name]
            spec = load_spec(base)
            return spec if quant is None else read_model({**spec.raw, "quantization_config": quant}, name, spec.source)
        return load_spec(name)
    except KvplanError:
        return None


def gpu_of(entry: dict) -> str | None:
    """The catalog name of a log's GPU, or None when the catalog has none such."""
    from kvplan.model.gpus import get_gpu

    text = str(entry["gpu"] or "")
    try:
        return get_gpu(next((v for k, v in GPU_NAMES.items() if text.startswith(k)), text)).name
    except KvplanError:
        return None


def log_lines(entries: list[dict]) -> None:
    """vLLM's "GPU KV cache size" and "Maximum concurrency" lines, computed from the pool the log
    itself states: a check of the block and group arithmetic alone (no fitted constant)."""
    from kvplan.model.size import size

    print(f"\n{'log (from its logged pool)':44} {'GPU KV cache tokens (logged / kvplan)':>40} {'concurrency':>22}")
    errs = []
    for e in entries:
        logged = e["logged"]
        if e["engine"] != "v1" or not logged["gpu_kv_cache_tokens"] or logged["available_kv_cache_gib"] is None:
            continue
        if (e.get("pp") or 1) > 1 or spec_of(e["model"]) is None or e["model"] in CHECKPOINTS:
            continue
        tokens = logged["max_concurrency_tokens"] or e["max_model_len"]
        if tokens is None:
            continue
        r = size(e["model"], kv_memory=int(logged["available_kv_cache_gib"] * GiB), tokens=tokens,
                 tp=e["tp"] or 1, kv_dtype=e.get("kv_cache_dtype") or "auto", gpu=gpu_of(e),
                 max_num_batched_tokens=e["max_num_batched_tokens"],
                 vllm_version=e.get("vllm_version") or PRE_PROFILED_GRAPHS).report
        err = r.vllm_kv_cache_tokens / logged["gpu_kv_cache_tokens"] - 1
        errs.append(abs(err))
        conc = f"{logged['max_concurrency']} / {r.vllm_concurrency:.2f}" if logged["max_concurrency"] else ""
        print(f"{e['id'][:44]:44} {logged['gpu_kv_cache_tokens']:>16,} / {r.vllm_kv_cache_tokens:>11,} ({err:+.1%})"
              f" {conc:>22}")
    if errs:
        print(f"median |error| of the token line {statistics.median(errs):.2%} over {len(errs)} (the logged pool is "
              "rounded to 0.01 GiB, so about 0.1% is noise)")


GRAPH_LOGS = ROOT / "tests" / "data" / "vllm_cuda_graph_logs.yaml"


def graph_lines() -> None:
    """CUDA graph memory: kvplan's estimate (vllm_memory.CUDA_GRAPH_BASE + _PER_LAYER x layers, set
    before these logs were collected, so all of them are held out) against the logs of catalog
    models captured at vLLM's default sizes."""
    from kvplan.model.resolve import catalog_ids
    from kvplan.model.vllm_memory import CUDA_GRAPH_BASE, CUDA_GRAPH_PER_LAYER

    ids = set(catalog_ids())
    print(f"\n{'CUDA graph log (held out)':44} {'GiB (logged / kvplan)':>24}")
    for e in yaml.safe_load(GRAPH_LOGS.read_text(encoding="utf-8"))["logs"]:
        guess = e["model_guess"]
        model = guess.get("id") if isinstance(guess, dict) else guess
        logged = e["logged"]["cuda_graph_gib"] or e["logged"]["graph_capture_gib"]
        if model not in ids or logged is None or "V0" in str(e["cudagraph_mode"]):
            continue
        spec = spec_of(model)
        got = (CUDA_GRAPH_BASE + CUDA_GRAPH_PER_LAYER * len(spec.layers)) / GiB
        print(f"{e['id'][:44]:44} {logged:>10.2f} / {got:.2f} ({got / logged - 1:+.0%})")


def source_of(entry: dict) -> str:
    """Who measured a log: its `source_group`, else its thread or page (one source each)."""
    return entry.get("source_group") or entry["source"]


def source_hash(source: str) -> int:
    import hashlib

    return int(hashlib.sha256(source.encode()).hexdigest(), 16)


def held_out_sources(entries: list[dict]) -> set[str]:
    """A third of the sources (rounded up) that no constant of vllm_memory.py was checked on: those
    of the lowest hash of their name among the sources outside CALIBRATION whose logs the bench
    predicts. A hash, not a choice: no source is held out or kept in for how it scores."""
    sources = {source_of(e) for e in entries}
    free = sorted((s for s in sources if not any(s.startswith(c) for c in CALIBRATION)), key=source_hash)
    return set(free[: -(-len(sources) // 3)])


def part_of(entry: dict, held_out: set[str]) -> str:
    """"held out" for the sources of held_out_sources, "fit" for the rest."""
    return "held out" if source_of(entry) in held_out else "fit"


# The sources the constants were checked on: SAMPLER_BYTES' 38 B and NON_TORCH_TP1 on the whole
# breakdowns of llm-d's H100 runs and a Qwen3-4B log; the gpt-oss-120b logs of the older fit.
CALIBRATION = ("llm-d", "benyucong", "https://github.com/vllm-project/vllm/issues/23278",
               "https://github.com/vllm-project/vllm/issues/27508")


def release_of(entry: dict) -> str:
    number = release_number(entry.get("vllm_version") or "")
    return f"0.{number[1]}" if number and number[0] == 0 else (entry.get("vllm_version") or "not stated")


def checks(entry: dict, report) -> dict[str, bool]:
    """The issue's tests of one log, where it states the figure: weights within 5%, the KV pool
    within max(10%, 0.5 GiB), GPU KV cache tokens and concurrency (from kvplan's own pool) within
    10%, the start verdict exact; a V0 log's and an inconsistent one's weights only."""
    logged, out = entry["logged"], {}
    if logged["model_loading_gib"]:
        out["weights"] = abs(report.weight_bytes / GiB / logged["model_loading_gib"] - 1) <= 0.05
    if entry.get("inconsistent"):
        return out  # its numbers contradict each other: the KV, tokens and verdict are not scored
    if entry["engine"] != "v1":
        return out  # V0 profiled its pool by other rules: neither its pool nor what follows from it is scored
    kv = logged["available_kv_cache_gib"]
    if kv is not None and report.memory_breakdown:
        got = report.memory_breakdown["kv"] / GiB
        out["kv"] = abs(got - kv) <= max(0.10 * abs(kv), 0.5)
    if logged.get("gpu_kv_cache_tokens") and report.vllm_kv_cache_tokens and report.reason is None:
        out["tokens"] = abs(report.vllm_kv_cache_tokens / logged["gpu_kv_cache_tokens"] - 1) <= 0.10
    if logged.get("max_concurrency") and report.vllm_concurrency and report.reason is None:
        out["concurrency"] = abs(report.vllm_concurrency / logged["max_concurrency"] - 1) <= 0.10
    if not any(x in str(entry["failure"]) for x in EXTERNAL):
        out["verdict"] = (report.reason is None) == (entry["outcome"] == "started")
    return out


def main() -> None:
    entries = yaml.safe_load(LOGS.read_text(encoding="utf-8"))["logs"]
    errors = {"fit": {"weights": [], "kv": []}, "held out": {"weights": [], "kv": []}}
    holds: dict[str, list[int]] = {}  # "part", "part release" and "cause" rows: [held, cases]
    print(f"{'log':44} {'part':8} {'weights GiB (logged / kvplan)':>31} {'KV GiB (logged / kvplan)':>27}  "
          "verdict  misses")
    predicted = []
    for e in entries:
        try:
            report = predict(e)
        except KvplanError:
            report = None
        if report is not None:
            predicted.append((e, report))
    held_out = held_out_sources([e for e, _ in predicted])
    for e, report in predicted:
        part = part_of(e, held_out)
        logged = e["logged"]
        w_text = kv_text = ""
        if logged["model_loading_gib"]:
            got = report.weight_bytes / GiB
            errors[part]["weights"].append(abs(got / logged["model_loading_gib"] - 1))
            w_text = f"{logged['model_loading_gib']:.2f} / {got:.2f} ({got / logged['model_loading_gib'] - 1:+.1%})"
        kv_logged = logged["available_kv_cache_gib"]
        if kv_logged is not None and e["engine"] == "v1" and report.memory_breakdown:
            got = report.memory_breakdown["kv"] / GiB
            if not e.get("inconsistent"):
                errors[part]["kv"].append(abs(got - kv_logged) / max(abs(kv_logged), 1.0))
            kv_text = f"{kv_logged:.2f} / {got:.2f} ({got - kv_logged:+.2f})"
        result = checks(e, report)
        verdict = "" if "verdict" not in result else "right" if result["verdict"] else "WRONG"
        misses = [k for k, ok in result.items() if not ok]
        if result:
            for key in (part, f"{part} {release_of(e)}"):
                row = holds.setdefault(key, [0, 0])
                row[0] += not misses
                row[1] += 1
            for cause in result:
                row = holds.setdefault(f"cause {cause} ({part})", [0, 0])
                row[0] += result[cause]
                row[1] += 1
        note = "(inconsistent: weights only)" if e.get("inconsistent") else ""
        print(f"{e['id'][:44]:44} {part:8} {w_text:>31} {kv_text:>27}  {verdict:7}  {' '.join(misses)}{note}")
    for part, errs in errors.items():
        med = {k: (f"{statistics.median(v):.1%} over {len(v)}" if v else "none") for k, v in errs.items()}
        print(f"{part:>8}: median |error| weights {med['weights']}, KV {med['kv']} (KV error as a share of "
              "max(logged, 1 GiB))")
    print("\ncases that hold (weights 5%, KV max(10%, 0.5 GiB), tokens and concurrency 10%, verdict exact):")
    for key in sorted(holds, key=lambda k: (k.startswith("cause"), k)):
        held, total = holds[key]
        print(f"  {key:32} {held:3} of {total:3} ({held / total:.0%})")
    log_lines(entries)
    graph_lines()


if __name__ == "__main__":
    main()
