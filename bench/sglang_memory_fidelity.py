"""Fidelity: kvplan's SGLang start-up rule against cited real SGLang start-up logs.

Reads tests/data/sglang_startup_logs.yaml (every number copied from the cited source) and, for
each log whose model kvplan resolves, predicts with kvplan/model/sglang_memory.py:
- weights per GPU ("Load weight end ... mem usage"): target within 5%;
- mem_fraction_static, where the log prints SGLang's ServerArgs: exact;
- max_total_num_tokens ("KV Cache is allocated. #tokens"): target within 10%, twice: from the GPU
  (the free memory from the GPU's total as CUDA reports it, the fraction and batch defaults from
  nvidia-smi's total as SGLang reads it, kvplan's weights; the issue's target), and from the log's
  own free memory before loading and its own weights (the pool arithmetic alone, cell size,
  default fraction and rounding: no estimate of the GPU or the weights in it);
- max_running_requests: exact, from the predicted pool;
- chunked_prefill_size: exact.
A log that states no release takes the rules in force at its date (sglang_memory.release_at).
Nothing here is fitted: the rule follows SGLang's source; CUDA_CONTEXT is read off one source
(CALIBRATION), which is reported apart.

Prints one line per log and the share of checks within tolerance, by field and by source.

Run: python bench/sglang_memory_fidelity.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from kvplan.errors import KvplanError  # noqa: E402

LOGS = ROOT / "tests" / "data" / "sglang_startup_logs.yaml"
GiB = 2**30
# The source kvplan's constants were read from (sglang_memory.CUDA_CONTEXT): reported apart.
CALIBRATION = ("https://github.com/didier-durand/llms-in-clouds", "https://github.com/sgl-project/sglang/pull/11716")
# Published quantized checkpoints of catalog models: (catalog model, quantization_config as the
# checkpoint's config.json publishes it), as in bench/vllm_memory_fidelity.py.
CHECKPOINTS = {
    "Qwen/Qwen3-235B-A22B-FP8": ("Qwen/Qwen3-235B-A22B",
                                 {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128]}),
}
TOLERANCE = {"weights": 0.05, "tokens_from_gpu": 0.10, "tokens_from_log": 0.10}  # swa_tokens_*: as tokens_*


def load_logs() -> list[dict]:
    return yaml.safe_load(LOGS.read_text(encoding="utf-8"))["logs"]


def source_of(entry: dict) -> str:
    """Who measured a log: its `source_group`, else its repository, thread or page."""
    if entry.get("source_group"):
        return entry["source_group"]
    src = entry["source"]
    if src.startswith("https://github.com/"):
        parts = src.split("/")
        return "/".join(parts[:5]) if "/blob/" in src or "/tree/" in src else src
    return src


def part_of(entry: dict) -> str:
    return "calibration" if any(source_of(entry).startswith(c) for c in CALIBRATION) else "held out"


def predict(entry: dict) -> dict | None:
    """kvplan's figures for one log, or None when kvplan cannot resolve its model."""
    from kvplan.model.build import build_layout
    from kvplan.model.gpus import get_gpu
    from kvplan.model.resolve import load_spec
    from kvplan.model.sglang_memory import model_identity, release_at, release_rules, startup_memory, startup_on
    from kvplan.model.weights import estimate_weights

    from kvplan.model.config import read_model

    try:
        if entry["model"] in CHECKPOINTS:
            base, quant = CHECKPOINTS[entry["model"]]
            spec = load_spec(base)
            spec = read_model({**spec.raw, "quantization_config": quant}, entry["model"], spec.source)
        else:
            spec = load_spec(entry["model"])
    except KvplanError:
        return None
    tp = entry.get("tp") or 1
    logged = entry["logged"]
    try:
        gpu = get_gpu(entry["gpu"]) if entry.get("gpu") else None
    except KvplanError:  # a GPU the catalog lacks: the log's own figures only
        gpu = None
    layout = build_layout(spec, entry.get("kv_cache_dtype") or "auto", tp)
    weights = estimate_weights(spec, entry.get("quantization"))
    release = entry.get("sglang_version") or release_at(entry.get("date"))
    try:
        release_rules(release)
    except KvplanError:  # a release older than the rules kvplan models: listed, not checked
        return None
    context = entry.get("context_length") or spec.max_context
    flags = dict(layout=layout, tp=tp, context_len=context, release=release,
                 mem_fraction_static=entry.get("mem_fraction_static"), **model_identity(spec))
    out = {"release": release, "weights": weights.bytes_per_gpu(tp, gpu) / GiB, "context": context,
           "extra_rows": release_rules(release).req_pool_extra}
    if gpu is not None:
        out["from_gpu"] = startup_on(gpu, weights=weights.bytes_per_gpu(tp, gpu), **flags)
    if logged.get("load_begin_avail_gib") is not None:
        pre = int(logged["load_begin_avail_gib"] * GiB)
        memory = gpu.cuda_memory_bytes if gpu is not None else pre
        if gpu is not None:
            flags = {**flags, "smi_memory": gpu.memory_bytes}
        if logged.get("rest_memory_gib") is not None:  # an instrumented log: its own rest, its own fraction
            fraction = 1 - (pre - int(logged["rest_memory_gib"] * GiB)) / pre
            flags = {**flags, "mem_fraction_static": fraction}
            out["from_log"] = startup_memory(weights=0, gpu_memory=memory, pre_load=pre, **flags)
        elif logged.get("weights_gib") is not None:
            out["from_log"] = startup_memory(weights=int(logged["weights_gib"] * GiB), gpu_memory=memory,
                                             pre_load=pre, **flags)
    return out


def checks(entry: dict, got: dict) -> dict[str, tuple[bool, str]]:
    """The issue's checks of one log, where it states the figure: (within tolerance, text)."""
    logged, out = entry["logged"], {}
    tokens = logged.get("max_total_num_tokens") or logged.get("kv_tokens")
    if logged.get("weights_gib"):
        err = got["weights"] / logged["weights_gib"] - 1
        out["weights"] = (abs(err) <= TOLERANCE["weights"],
                          f"{logged['weights_gib']:.2f} / {got['weights']:.2f} GiB ({err:+.1%})")
    for key in ("from_gpu", "from_log"):
        m = got.get(key)
        if m is None or not tokens:
            continue
        err = m.max_total_num_tokens / tokens - 1
        out[f"tokens_{key}"] = (abs(err) <= TOLERANCE[f"tokens_{key}"],
                                f"{tokens:,} / {m.max_total_num_tokens:,} ({err:+.1%})")
        if logged.get("swa_layer_tokens"):  # a hybrid SWA pool's second pool (rule 5), the same tolerance
            err = m.swa_tokens / logged["swa_layer_tokens"] - 1
            out[f"swa_tokens_{key}"] = (abs(err) <= TOLERANCE[f"tokens_{key}"],
                                        f"{logged['swa_layer_tokens']:,} / {m.swa_tokens:,} ({err:+.1%})")
    m = got.get("from_gpu") or got.get("from_log")
    if m is not None and logged.get("server_args_mem_fraction_static") is not None \
            and entry.get("mem_fraction_static") is None and "from_gpu" in got:
        want = logged["server_args_mem_fraction_static"]
        out["mem_fraction_static"] = (got["from_gpu"].mem_fraction_static == want,
                                      f"{want} / {got['from_gpu'].mem_fraction_static}")
    if m is not None and logged.get("max_running_requests") is not None:
        want = logged["max_running_requests"]
        out["max_running_requests"] = (m.max_running_requests == want, f"{want} / {m.max_running_requests}")
    elif logged.get("max_running_requests") is not None and logged.get("max_total_num_tokens"):
        # the log's own pool: rule 3 alone (max_num_reqs and the req_to_token pool of its release)
        from kvplan.model.sglang_memory import max_running, request_rows

        want, tokens = logged["max_running_requests"], logged["max_total_num_tokens"]
        pred = max_running(tokens, request_rows(tokens, logged.get("context_len") or got["context"]) + got["extra_rows"])
        out["max_running_requests"] = (pred == want, f"{want} / {pred}")
    if "from_gpu" in got and logged.get("chunked_prefill_size") is not None:
        want = logged["chunked_prefill_size"]
        out["chunked_prefill_size"] = (got["from_gpu"].chunked_prefill_size == want,
                                       f"{want} / {got['from_gpu'].chunked_prefill_size}")
    return out


def evaluate(entries: list[dict]) -> list[tuple[dict, dict]]:
    """(entry, checks) for every log whose model kvplan resolves and whose setting it models."""
    rows = []
    for e in entries:
        got = None if e.get("not_modelled") else predict(e)
        if got is not None:
            rows.append((e, checks(e, got)))
    return rows


def shares(rows: list[tuple[dict, dict]]) -> dict[str, list[int]]:
    """[held, checked] per field, per source and per part; "all" counts every check."""
    out: dict[str, list[int]] = {}
    for e, result in rows:
        for field, (ok, _) in result.items():
            for key in ("all", f"field {field}", f"source {source_of(e)}", f"part {part_of(e)}"):
                row = out.setdefault(key, [0, 0])
                row[0] += ok
                row[1] += 1
    return out


def main() -> None:
    entries = load_logs()
    rows = evaluate(entries)
    print(f"{len(entries)} logs, {len(rows)} with a model kvplan resolves and a setting it models, "
          f"{len({source_of(e) for e, _ in rows})} sources\n")
    for e, result in rows:
        misses = [k for k, (ok, _) in result.items() if not ok]
        print(f"{e['id']} ({part_of(e)})")
        for field, (ok, text) in result.items():
            print(f"    {field:22} logged / kvplan {text:>40}  {'ok' if ok else 'MISS'}")
        if misses:
            print(f"    misses: {' '.join(misses)}")
    print("\nshare within tolerance (weights 5%, tokens 10%, max_running_requests, chunked_prefill_size and "
          "mem_fraction_static exact):")
    for key, (held, total) in sorted(shares(rows).items(), key=lambda kv: (kv[0] != "all", kv[0])):
        print(f"  {key:70} {held:3} of {total:3} ({held / total:.0%})")
    checked = {e["id"] for e, _ in rows}
    print("\nnot checked:")
    for e in entries:
        if e["id"] not in checked:
            why = e.get("not_modelled") or (f"SGLang {e['sglang_version']} predates the modelled releases"
                                            if old_release(e) else "a model kvplan does not resolve")
            print(f"  {e['id']}: {why}")


def old_release(entry: dict) -> bool:
    """Whether the log states a release older than the rules kvplan models (release_rules refuses it)."""
    from kvplan.model.sglang_memory import release_rules

    try:
        release_rules(entry.get("sglang_version") or "0.5.3")
    except KvplanError:
        return True
    return False


if __name__ == "__main__":
    main()
