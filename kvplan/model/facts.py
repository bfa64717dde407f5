"""Everything the simulator needs to know about a model on a GPU, in one call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvplan.model.layout import KVLayout


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """A model served at a KV dtype and TP degree, on a GPU or none: the `resolve_model` contract
    of `kvplan.workload.build.build_workload`."""

    layout: KVLayout
    weight_bytes: int = 0  # per GPU
    gpu: Any = None  # kvplan.model.gpus.GPU, None without one
    flops_per_token: float = 0.0  # forward FLOPs per processed token, per GPU
    params: int = 0
    step_model: Any = None  # kvplan.model.step_time.StepModel, with a GPU
    spec: Any = None  # kvplan.model.spec.ModelSpec, when resolved from a config
    weights: Any = None  # kvplan.model.weights.WeightEstimate, with it
    shape_extra: Any = None  # more of vLLM's start-up shape (a DP run's process groups: parallel_size.py)

    def startup(self, *, max_model_len: int, gpu_memory_utilization: float | None = None,
                max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None,
                enable_prefix_caching: bool = True):
        """What vLLM allocates at start-up with these settings on this GPU, and whether it starts:
        `kvplan size`'s report (kvplan/model/fit.py; its kv_pool_bytes is the KV pool vLLM logs).
        None without a GPU or a config (a hand-made resolver's facts)."""
        if self.gpu is None or self.spec is None or self.weights is None:
            return None
        from kvplan.model.fit import size_model
        from kvplan.model.vllm_memory import EngineOptions
        from kvplan.model.weights import engine_shape

        options = EngineOptions(gpu_memory_utilization=gpu_memory_utilization, max_num_batched_tokens=max_num_batched_tokens,
                                max_num_seqs=max_num_seqs, enable_prefix_caching=enable_prefix_caching)
        return size_model(self.layout, tokens=max_model_len, weight_bytes=self.weights.bytes,
                          weight_bytes_per_gpu=self.weight_bytes, params=self.params, gpu=self.gpu,
                          gpu_memory_utilization=gpu_memory_utilization, engine="vllm", engine_options=options,
                          engine_shape={**engine_shape(self.spec), **(self.shape_extra or {})})


def model_facts(model: str, kv_dtype: str = "auto", tp: int = 1, gpu_name: str | None = None) -> ModelFacts:
    """Layout, weight bytes per GPU, GPU record, forward FLOPs per token and the step-time model."""
    from kvplan.model.build import build_layout
    from kvplan.model.gpus import get_gpu
    from kvplan.model.resolve import load_spec
    from kvplan.model.step_time import step_model
    from kvplan.model.weights import estimate_weights

    spec = load_spec(model)
    weights = estimate_weights(spec)
    layout = build_layout(spec, kv_dtype, tp)
    gpu = get_gpu(gpu_name) if gpu_name else None
    return ModelFacts(
        layout=layout,
        weight_bytes=weights.bytes_per_gpu(tp, gpu),
        gpu=gpu,
        flops_per_token=weights.flops_per_token / tp,
        params=weights.params,
        step_model=step_model(spec, layout, weights, gpu, tp) if gpu is not None else None,
        spec=spec,
        weights=weights,
    )
