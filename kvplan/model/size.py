"""`kvplan size` as one library call: resolve, read, lay out, weigh and fit a model."""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.errors import ConfigError, UsageError
from kvplan.model.build import build_layout
from kvplan.model.dtypes import KV_DTYPE_CHOICES
from kvplan.model.fit import SizeReport, size_model
from kvplan.model.layout import KVLayout
from kvplan.model.resolve import load_spec
from kvplan.model.vllm_memory import VLLM_RELEASE, EngineOptions, release_rules
from kvplan.model.weights import engine_shape, estimate_weights
from kvplan.units import parse_size


ENGINES = ("vllm", "none")


@dataclass(frozen=True, slots=True)
class SizeRun:
    report: SizeReport
    layout: KVLayout
    notes: tuple[str, ...]

    def to_dict(self) -> dict:
        return {**self.report.to_dict(), "notes": list(self.notes)}


def size(
    model: str,
    *,
    tokens: int | None = None,
    kv_dtype: str = "auto",
    tp: int = 1,
    batch: int = 1,
    gpu: str | None = None,
    gpu_memory_utilization: float | None = None,
    kv_memory: str | int | None = None,
    block_size: int = 16,
    engine: str = "vllm",
    quantization: str | None = None,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    enforce_eager: bool = False,
    vllm_version: str = VLLM_RELEASE,
    enable_prefix_caching: bool = True,
) -> SizeRun:
    """Everything `kvplan size` prints, as data; bad options raise KvplanError naming the option.

    With a GPU and engine "vllm" the pool is what vLLM will log as "Available KV cache memory"
    (kvplan/model/vllm_memory.py) and `tokens` is vLLM's max_model_len; engine "none" keeps
    the bare bound: the GPU's memory x utilization less the weights.
    """
    if engine not in ENGINES:
        raise UsageError(f"expected one of {', '.join(ENGINES)}, got {engine!r}", field="--engine")
    for field, value in (("--max-num-batched-tokens", max_num_batched_tokens), ("--max-num-seqs", max_num_seqs)):
        if value is not None and not 1 <= value <= 2**31:
            raise UsageError(f"expected an integer from 1 to 2^31, got {value}", field=field)
    release_rules(vllm_version)  # a bad release is refused before any work
    if kv_dtype not in KV_DTYPE_CHOICES:
        raise UsageError(f"expected one of {', '.join(KV_DTYPE_CHOICES)}, got {kv_dtype!r}", field="--kv-dtype")
    if gpu_memory_utilization is not None and gpu is None:
        raise UsageError("applies only with --gpu (the pool is then that share of its memory, less the weights)",
                         field="--gpu-memory-utilization")
    if gpu is not None and kv_memory is not None:
        raise UsageError("give --gpu (with --gpu-memory-utilization) or --kv-memory, not both", field="--kv-memory")
    gpu_spec = None
    if gpu is not None:
        from kvplan.model.gpus import get_gpu

        gpu_spec = get_gpu(gpu)
    kv_bytes = parse_size(kv_memory, field="--kv-memory") if kv_memory is not None else None
    spec = load_spec(model)
    layout = build_layout(spec, kv_dtype, tp)
    notes = [spec.dtype_note] if spec.dtype_note else []
    weights = estimate_weights(spec, quantization)
    if weights.scheme != "none":
        notes.append(f"weights as loaded: {weights.scheme}")
    if tokens is None and spec.max_context is None:
        raise ConfigError("missing; the config states no context length (ALiBi models such as BLOOM "
                          "have none), so give --tokens", file=spec.source, field="max_position_embeddings")
    report = size_model(
        layout,
        tokens=tokens if tokens is not None else spec.max_context,
        batch=batch,
        block_size=block_size,
        weight_bytes=weights.bytes,
        weight_bytes_per_gpu=weights.bytes_per_gpu(tp),
        params=weights.params,
        gpu=gpu_spec,
        gpu_memory_utilization=gpu_memory_utilization,
        kv_memory=kv_bytes,
        engine=engine,
        engine_options=EngineOptions(
            gpu_memory_utilization=gpu_memory_utilization, max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs, enforce_eager=enforce_eager, release=vllm_version,
            enable_prefix_caching=enable_prefix_caching),
        engine_shape=engine_shape(spec),
    )
    if spec.max_context is not None and report.tokens > spec.max_context:
        notes.append(f"{report.tokens:,} tokens is beyond the model's context of {spec.max_context:,}")
    return SizeRun(report, layout, tuple(notes))
