"""`kvplan size` with data, expert or pipeline parallelism: one fit per pipeline stage, vLLM's
smallest-stage pool, and the concurrency of each DP rank and of all of them (kvplan/model/parallel.py
for the rules and their sources)."""

from __future__ import annotations

from dataclasses import replace

from kvplan.model.build import build_layout
from kvplan.model.fit import SizeReport, size_model
from kvplan.model.layout import KVLayout
from kvplan.model.parallel import (Parallelism, communicators, experts_per_rank, stage_bounds, stage_spec,
                                   stage_weight_bytes)
from kvplan.model.spec import ModelSpec
from kvplan.model.weights import WeightEstimate, engine_shape, moe_shape


def _blocks(report: SizeReport) -> int | None:
    return report.vllm_num_blocks if report.vllm_num_blocks is not None else report.num_blocks


def parallel_fit(spec: ModelSpec, par: Parallelism, weights: WeightEstimate, *, gpu, kv_dtype: str, tokens: int,
                 batch: int, block_size: int, kv_memory: int | None, engine: str, options,
                 gpu_memory_utilization: float | None, mxfp4_backend: str) -> tuple[SizeReport, KVLayout, dict]:
    """The fit of every pipeline stage on one GPU of its own, and which decides the pool: the
    report of that stage (fits and reason: every stage must start), its layout, and the
    `parallel` section of `kvplan size --json`."""
    at_init, in_profile = communicators(spec, par)
    stages = []
    for s, (start, end) in enumerate(stage_bounds(len(spec.layers), par.pp)):
        sub = stage_spec(spec, start, end)
        layout = build_layout(sub, kv_dtype, par.tp)
        weight = stage_weight_bytes(spec, weights, par, s, gpu, mxfp4_backend)
        shape = {**engine_shape(sub), "sampler": s == par.pp - 1, "groups_at_init": at_init,
                 "groups_in_profile": in_profile}
        report = size_model(layout, tokens=tokens, batch=batch, block_size=block_size, weight_bytes=weights.bytes,
                            weight_bytes_per_gpu=weight, params=weights.params, gpu=gpu,
                            gpu_memory_utilization=gpu_memory_utilization, kv_memory=kv_memory, engine=engine,
                            engine_options=options, engine_shape=shape)
        stages.append((start, end, layout, report))
    pooled = [st for st in stages if _blocks(st[3]) is not None]
    if pooled:  # vLLM gives every stage the blocks of the one with the fewest
        index = min(range(len(stages)), key=lambda i: (_blocks(stages[i][3]), i))
    else:  # no GPU and no pool: the stage holding the most KV per token
        index = max(range(len(stages)), key=lambda i: (stages[i][2].bytes_per_token, -i))
    _, _, layout, report = stages[index]
    reason = next((st[3].reason for st in stages if st[3].reason is not None), None)
    if report.fits is not None:
        report = replace(report, fits=report.fits and reason is None, reason=reason)
    experts, _ = moe_shape(spec)
    info = {
        **par.to_dict(),
        "experts_per_gpu": experts_per_rank(spec, par) if experts else None,
        "bottleneck_stage": index,
        "stages": [{"layers": [start, end], "weight_bytes": r.weight_bytes, "bytes_per_token": lay.bytes_per_token,
                    "kv_pool_bytes": r.kv_pool_bytes, "num_blocks": _blocks(r), "reason": r.reason}
                   for start, end, lay, r in stages],
    }
    if report.kv_pool_bytes is not None:
        info.update({
            "kv_tokens_per_dp_rank": report.vllm_kv_cache_tokens,
            "vllm_concurrency_per_dp_rank": report.vllm_concurrency,
            "vllm_concurrency_total": report.vllm_concurrency * par.dp,
            "max_concurrency_per_dp_rank": report.max_concurrency,
            "max_concurrency_total": report.max_concurrency * par.dp,
        })
    return report, layout, info


def parallel_note(info: dict) -> str:
    """One line of what the GPUs hold (the `notes` of kvplan size)."""
    parts = [f"{info['gpus']} GPUs: tp {info['tp']} x dp {info['dp']} x pp {info['pp']}"]
    if info["enable_expert_parallel"]:
        parts.append(f"EP {info['ep']} (tp x dp), {info['experts_per_gpu']} whole experts per GPU")
    elif info["experts_per_gpu"] and info["dp"] > 1:
        parts.append(f"every expert split over tp x dp = {info['tp'] * info['dp']} GPUs (no --enable-expert-parallel)")
    if info["dp"] > 1:
        parts.append("attention and dense layers copied on each DP rank, each with its own scheduler and KV pool")
    if info["pp"] > 1:
        layers = ", ".join(f"{b - a}" for a, b in (s["layers"] for s in info["stages"]))
        parts.append(f"layers per stage {layers}, each stage its own layers' KV; the stage with the fewest blocks "
                     f"(stage {info['bottleneck_stage']}) sets the pool")
    return "; ".join(parts)
