"""Everything the simulator needs to know about a model on a GPU, in one call."""

from __future__ import annotations

from kvplan.model.build import build_layout
from kvplan.model.gpus import get_gpu
from kvplan.model.resolve import load_spec
from kvplan.model.step_time import step_model
from kvplan.model.weights import estimate_weights


def model_facts(model: str, kv_dtype: str = "auto", tp: int = 1, gpu_name: str | None = None) -> dict:
    """Layout, weight bytes per GPU, GPU record and forward FLOPs per token for a workload.

    The shape of the dict is the `resolve_model` contract of `kvplan.workload.schema.load_workload`.
    """
    spec = load_spec(model)
    weights = estimate_weights(spec)
    layout = build_layout(spec, kv_dtype, tp)
    gpu = get_gpu(gpu_name) if gpu_name else None
    return dict(
        layout=layout,
        weight_bytes=weights.bytes_per_gpu(tp),
        gpu=gpu,
        flops_per_token=weights.flops_per_token / tp,
        params=weights.params,
        step_model=step_model(spec, layout, weights, gpu, tp) if gpu is not None else None,
    )
