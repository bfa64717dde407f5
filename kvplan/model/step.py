"""`kvplan step` as one library call: resolve the model and GPU, check the options, report."""

from __future__ import annotations

from kvplan.errors import UsageError
from kvplan.model.build import build_layout
from kvplan.model.gpus import get_gpu
from kvplan.model.resolve import load_spec
from kvplan.model.step_time import CONSTANTS, engine_constants, step_report
from kvplan.model.weights import estimate_weights

LIMIT = 2**31
STEP_ENGINES = ("vllm", "sglang")


def step_of(model: str, *, gpu: str = "H100-80GB", tp: int = 1, batch: int = 64, context: int = 4096,
            chunk: int = 8192, kv_dtype: str = "auto", quantization: str | None = None,
            enforce_eager: bool = False, timing_profile: str | None = None, engine: str = "vllm") -> dict:
    """The step-time report of one decode step and one prefill chunk. `engine` sglang restates the
    host overheads for SGLang's runtime and server (kvplan/model/step_time.engine_constants) and
    checks the batch against SGLang's pool (kvplan/model/sglang_memory.py); a timing profile is
    taken as the constants of the engine it was fitted on, unscaled."""
    if engine not in STEP_ENGINES:
        raise UsageError(f"expected one of {', '.join(STEP_ENGINES)}, got {engine!r}", field="--engine")
    for name, value in (("--batch", batch), ("--context", context), ("--chunk", chunk)):
        if not 1 <= value <= LIMIT:
            raise UsageError(f"expected an integer from 1 to 2^31, got {value}", field=name)
    gpu_spec = get_gpu(gpu)
    spec = load_spec(model)
    layout = build_layout(spec, kv_dtype, tp)
    weights = estimate_weights(spec, quantization)
    constants, overlap = engine_constants(CONSTANTS, engine), True
    if timing_profile is not None:
        from kvplan.model.timing_profile import profile_option

        _, constants, overlap = profile_option(timing_profile)
    report = step_report(spec, layout, weights, gpu_spec, tp=tp, batch=batch, context=context, chunk=chunk,
                         enforce_eager=enforce_eager, constants=constants, async_scheduling=overlap)
    report["engine"] = engine
    report["timing_profile"] = timing_profile
    report["memory"] = (_sglang_memory(spec, layout, weights, gpu_spec, tp, batch, context) if engine == "sglang"
                        else _memory(spec, layout, weights, gpu_spec, tp, batch, context, chunk, enforce_eager))
    return report


def _memory(spec, layout, weights, gpu, tp, batch, context, chunk, enforce_eager) -> dict:
    """Whether the decode step's batch fits the KV pool vLLM allocates on this GPU at its defaults
    (what `kvplan size --gpu G --tokens CONTEXT --batch BATCH` decides): a step time of a batch
    that cannot be held is a number no server reaches."""
    from kvplan.model.fit import size_model
    from kvplan.model.vllm_memory import EngineOptions
    from kvplan.model.weights import engine_shape

    fit = size_model(layout, tokens=context, batch=batch, weight_bytes=weights.bytes,
                     weight_bytes_per_gpu=weights.bytes_per_gpu(tp, gpu), params=weights.params, gpu=gpu,
                     engine="vllm", engine_options=EngineOptions(max_num_batched_tokens=chunk,
                                                                 enforce_eager=enforce_eager),
                     engine_shape=engine_shape(spec))
    beyond = spec.max_context is not None and context > spec.max_context
    return {"batch_kv_bytes": fit.batch_kv_bytes, "kv_pool_bytes": fit.kv_pool_bytes,
            "max_concurrency": fit.max_concurrency, "fits": fit.fits and not beyond, "reason": fit.reason,
            "model_context": spec.max_context, "beyond_context": beyond}



def _sglang_memory(spec, layout, weights, gpu, tp, batch, context) -> dict:
    """Whether the decode step's batch fits SGLang's pool on this GPU at its defaults (what `kvplan
    size --engine sglang` prints): `batch` x `context` tokens within max_total_num_tokens, and
    `batch` within max_running_requests."""
    from kvplan.model.sglang_memory import SGLANG_RELEASE, startup_memory

    beyond = spec.max_context is not None and context > spec.max_context
    m = startup_memory(layout=layout, weights=weights.bytes_per_gpu(tp, gpu), gpu_memory=gpu.cuda_memory_bytes,
                       tp=tp, context_len=max(context, spec.max_context or context), release=SGLANG_RELEASE,
                       model_type=spec.model_type, link_bytes_per_s=gpu.link_bytes_per_s,
                       smi_memory=gpu.memory_bytes)
    concurrency = min(m.max_total_num_tokens // max(context, 1), m.max_running_requests) if m.starts else 0
    return {"batch_kv_bytes": batch * context * m.cell_size, "kv_pool_bytes": m.kv_pool if m.starts else 0,
            "max_concurrency": concurrency, "fits": m.starts and concurrency >= batch and not beyond,
            "reason": m.reason, "model_context": spec.max_context, "beyond_context": beyond,
            "max_total_num_tokens": m.max_total_num_tokens, "max_running_requests": m.max_running_requests}
