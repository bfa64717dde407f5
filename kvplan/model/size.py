"""`kvplan size` as one library call: resolve, read, lay out, weigh and fit a model."""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.errors import UsageError
from kvplan.model.build import build_layout
from kvplan.model.dtypes import KV_DTYPE_CHOICES
from kvplan.model.fit import SizeReport, size_model
from kvplan.model.layout import KVLayout
from kvplan.model.resolve import load_spec
from kvplan.model.weights import estimate_weights
from kvplan.units import parse_size


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
) -> SizeRun:
    """Everything `kvplan size` prints, as data; bad options raise KvplanError naming the option."""
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
    weights = estimate_weights(spec)
    report = size_model(
        layout,
        tokens=tokens if tokens is not None else spec.max_context,
        batch=batch,
        block_size=block_size,
        weight_bytes=weights.bytes,
        params=weights.params,
        gpu=gpu_spec,
        gpu_memory_utilization=0.92 if gpu_memory_utilization is None else gpu_memory_utilization,
        kv_memory=kv_bytes,
    )
    if report.tokens > spec.max_context:
        notes.append(f"{report.tokens:,} tokens is beyond the model's context of {spec.max_context:,}")
    return SizeRun(report, layout, tuple(notes))
