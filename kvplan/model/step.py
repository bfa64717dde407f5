"""`kvplan step` as one library call: resolve the model and GPU, check the options, report."""

from __future__ import annotations

from kvplan.errors import UsageError
from kvplan.model.build import build_layout
from kvplan.model.gpus import get_gpu
from kvplan.model.resolve import load_spec
from kvplan.model.step_time import CONSTANTS, step_report
from kvplan.model.weights import estimate_weights

LIMIT = 2**31


def step_of(model: str, *, gpu: str = "H100-80GB", tp: int = 1, batch: int = 64, context: int = 4096,
            chunk: int = 8192, kv_dtype: str = "auto", quantization: str | None = None,
            enforce_eager: bool = False, timing_profile: str | None = None,
            speculative: str | None = None, num_speculative_tokens: int | None = None,
            acceptance: str | None = None) -> dict:
    for name, value in (("--batch", batch), ("--context", context), ("--chunk", chunk)):
        if not 1 <= value <= LIMIT:
            raise UsageError(f"expected an integer from 1 to 2^31, got {value}", field=name)
    sp = None
    if speculative is not None:
        from kvplan.model.speculative import make_speculative

        sp = make_speculative(speculative, num_speculative_tokens, acceptance)
    elif num_speculative_tokens is not None or acceptance is not None:
        raise UsageError("needs --speculative METHOD (eagle, eagle3, mtp, ngram)",
                         field="--num-speculative-tokens" if num_speculative_tokens is not None else "--acceptance")
    gpu_spec = get_gpu(gpu)
    spec = load_spec(model)
    layout = build_layout(spec, kv_dtype, tp)
    weights = estimate_weights(spec, quantization)
    constants, overlap = CONSTANTS, True
    if timing_profile is not None:
        from kvplan.model.timing_profile import profile_option

        _, constants, overlap = profile_option(timing_profile)
    report = step_report(spec, layout, weights, gpu_spec, tp=tp, batch=batch, context=context, chunk=chunk,
                         enforce_eager=enforce_eager, constants=constants, async_scheduling=overlap)
    report["timing_profile"] = timing_profile
    if sp is not None:
        report["speculative"] = _speculative(spec, layout, weights, gpu_spec, tp, enforce_eager, constants, overlap,
                                             sp, batch, context)
    report["memory"] = _memory(spec, layout, weights, gpu_spec, tp, batch, context, chunk, enforce_eager)
    return report


def _speculative(spec, layout, weights, gpu, tp, enforce_eager, constants, overlap, sp, batch, context) -> dict:
    """The decode step with speculation (kvplan/model/speculative.py), beside the plain one."""
    from kvplan.model.speculative import speculative_section
    from kvplan.model.step_time import step_model

    target = step_model(spec, layout, weights, gpu, tp, enforce_eager=enforce_eager, constants=constants,
                        async_scheduling=overlap)
    per_token = [(g.bytes_per_token, g.tokens_held(context)) for g in layout.groups if g.bytes_per_token]
    total = sum(b for b, _ in per_token)
    read = sum(b * held for b, held in per_token) // total if total else context
    return speculative_section(spec, layout, weights, target, sp, batch=batch, read=read)


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

