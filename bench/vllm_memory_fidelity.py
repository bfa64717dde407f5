"""Fidelity: kvplan's prediction of vLLM's start-up memory against cited real start-up logs.

Reads tests/data/vllm_startup_logs.yaml (every number copied from the cited source) and, for
each log whose model is in the bundled catalog (or is a published quantized checkpoint of a
catalog model, with its published `quantization_config` below) and whose GPU is in the GPU
catalog, predicts:
- "Model loading took" (weights per GPU): target within 3%;
- "Available KV cache memory" (V1 logs only; V0 profiled differently): target within
  max(5%, 1 GiB);
- the start/fail verdict, when the log shows enough settings to decide it.
A setting the log does not state takes vLLM's default (utilization 0.9, max_model_len the
model's context, the batch defaults of `vllm serve`).

FITTED names the logs that set kvplan's one fitted constant (vllm_memory.A_LOGITS); every
other log is held out. Prints one line per log and the median absolute error of each part.

Run: python bench/vllm_memory_fidelity.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
LOGS = ROOT / "tests" / "data" / "vllm_startup_logs.yaml"
GiB = 2**30
FITTED = {"gpt-oss-120b-h100-v1-negative-kv", "gpt-oss-120b-h100-v1-gmu095-mnbt1024"}
# Published quantized checkpoints of catalog models: (catalog model, quantization_config as the
# checkpoint's config.json publishes it).
CHECKPOINTS = {
    "Qwen/Qwen2.5-72B-Instruct-GPTQ-Int4": ("Qwen/Qwen2.5-72B-Instruct",
                                            {"quant_method": "gptq", "bits": 4, "group_size": 128,
                                             "desc_act": False, "sym": True}),
    "Qwen/Qwen3-235B-A22B-FP8": ("Qwen/Qwen3-235B-A22B",
                                 {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128]}),
}
GPU_NAMES = {"A100 (memory": "A100-80GB"}  # GPU text as the logs write it -> catalog name


def predict(entry: dict):
    from kvplan.errors import KvplanError
    from kvplan.model.build import build_layout
    from kvplan.model.config import read_model
    from kvplan.model.fit import size_model
    from kvplan.model.gpus import get_gpu
    from kvplan.model.resolve import load_spec
    from kvplan.model.vllm_memory import EngineOptions
    from kvplan.model.weights import engine_shape, estimate_weights

    name = entry["model"]
    if (entry.get("pp") or 1) > 1:
        return None  # pipeline parallelism is not modelled yet
    try:
        if name in CHECKPOINTS:
            base, quant = CHECKPOINTS[name]
            spec = load_spec(base)
            spec = read_model({**spec.raw, "quantization_config": quant}, name, spec.source)
        else:
            spec = load_spec(name)
        gpu_text = str(entry["gpu"] or "")
        gpu = get_gpu(next((v for k, v in GPU_NAMES.items() if gpu_text.startswith(k)), gpu_text))
    except KvplanError:
        return None
    tp = entry["tp"] or 1
    weights = estimate_weights(spec)
    layout = build_layout(spec, entry.get("kv_cache_dtype") or "auto", tp)
    report = size_model(layout, tokens=entry["max_model_len"] or spec.max_context or 8192,
                        weight_bytes=weights.bytes, weight_bytes_per_gpu=weights.bytes_per_gpu(tp),
                        params=weights.params, gpu=gpu, engine="vllm",
                        engine_options=EngineOptions(
                            gpu_memory_utilization=entry["gpu_memory_utilization"] or 0.9,
                            max_num_batched_tokens=entry["max_num_batched_tokens"],
                            max_num_seqs=entry["max_num_seqs"],
                            enforce_eager=bool(entry["enforce_eager"])),
                        engine_shape=engine_shape(spec))
    return report


def main() -> None:
    entries = yaml.safe_load(LOGS.read_text(encoding="utf-8"))["logs"]
    errors = {"fitted": {"weights": [], "kv": []}, "held out": {"weights": [], "kv": []}}
    verdicts = {"fitted": [0, 0], "held out": [0, 0]}
    print(f"{'log':44} {'part':8} {'weights GiB (logged / kvplan)':>31} {'KV GiB (logged / kvplan)':>27}  verdict")
    for e in entries:
        report = predict(e)
        if report is None:
            continue
        part = "fitted" if e["id"] in FITTED else "held out"
        logged = e["logged"]
        w_text = kv_text = ""
        if logged["model_loading_gib"]:
            got = report.weight_bytes / GiB
            errors[part]["weights"].append(abs(got / logged["model_loading_gib"] - 1))
            w_text = f"{logged['model_loading_gib']:.2f} / {got:.2f} ({got / logged['model_loading_gib'] - 1:+.1%})"
        kv_logged = logged["available_kv_cache_gib"]
        if kv_logged is not None and e["engine"] == "v1" and report.memory_breakdown:
            got = report.memory_breakdown["kv"] / GiB
            errors[part]["kv"].append(abs(got - kv_logged) / max(abs(kv_logged), 1.0))
            kv_text = f"{kv_logged:.2f} / {got:.2f} ({got - kv_logged:+.2f})"
        verdict = ""
        if e["engine"] == "v1":
            right = (report.reason is None) == (e["outcome"] == "started")
            verdicts[part][0] += right
            verdicts[part][1] += 1
            verdict = "right" if right else "WRONG"
        print(f"{e['id'][:44]:44} {part:8} {w_text:>31} {kv_text:>27}  {verdict}")
    for part, errs in errors.items():
        med = {k: (f"{statistics.median(v):.1%} over {len(v)}" if v else "none") for k, v in errs.items()}
        right, total = verdicts[part]
        print(f"{part:>8}: median |error| weights {med['weights']}, KV {med['kv']} (KV error as a share of "
              f"max(logged, 1 GiB)); verdicts right {right} of {total}")


if __name__ == "__main__":
    main()
