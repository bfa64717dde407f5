"""`kvplan step` as one library call: resolve the model and GPU, check the options, report."""

from __future__ import annotations

from kvplan.errors import UsageError
from kvplan.model.build import build_layout
from kvplan.model.gpus import get_gpu
from kvplan.model.resolve import load_spec
from kvplan.model.step_time import CONSTANTS, api_server_s, engine_constants, step_report
from kvplan.model.weights import estimate_weights

LIMIT = 2**31
STEP_ENGINES = ("vllm", "sglang")


def step_of(model: str, *, gpu: str = "H100-80GB", tp: int = 1, batch: int = 64, context: int = 4096,
            chunk: int | None = None, kv_dtype: str = "auto", quantization: str | None = None,
            enforce_eager: bool = False, timing_profile: str | None = None, engine: str = "vllm", dp: int = 1,
            pp: int = 1, enable_expert_parallel: bool = False, all2all_backend: str | None = None,
            expert_imbalance: float | None = None, enable_dbo: bool = False,
            network_gbps: float | None = None, speculative: str | None = None,
            num_speculative_tokens: int | None = None, acceptance: str | None = None) -> dict:
    """The step-time report of one decode step and one prefill chunk. `engine` sglang restates the
    host overheads for SGLang's runtime and server (kvplan/model/step_time.engine_constants) and
    checks the batch against SGLang's pool (kvplan/model/sglang_memory.py); a timing profile is
    taken as the constants of the engine it was fitted on, unscaled. `dp`, `pp` and
    `enable_expert_parallel` (vLLM's parallelism, with the all-to-all's options) take the parallel
    step model of kvplan/model/parallel_step.py. `speculative` (a method, with
    `num_speculative_tokens` and per-position `acceptance`) adds vLLM's speculative decoding step
    (kvplan/model/speculative.py) without dp, pp or expert parallelism: vLLM's, or SGLang's chain
    (speculative_eagle_topk 1, num_steps k), whose step has the same passes."""
    if engine not in STEP_ENGINES:
        raise UsageError(f"expected one of {', '.join(STEP_ENGINES)}, got {engine!r}", field="--engine")
    for name, value in (("--batch", batch), ("--context", context), ("--chunk", chunk)):
        if value is not None and not 1 <= value <= LIMIT:
            raise UsageError(f"expected an integer from 1 to 2^31, got {value}", field=name)
    sp = None
    if speculative is not None:
        from kvplan.model.speculative import SGLANG_METHODS, make_speculative, sglang_refusal

        sp = make_speculative(speculative, num_speculative_tokens, acceptance)
        if engine == "sglang" and sp.method not in SGLANG_METHODS:
            raise UsageError(sglang_refusal("--engine sglang"), field="--speculative")
    elif num_speculative_tokens is not None or acceptance is not None:
        raise UsageError("needs --speculative METHOD (eagle, eagle3, mtp, ngram)",
                         field="--num-speculative-tokens" if num_speculative_tokens is not None else "--acceptance")
    gpu_spec = get_gpu(gpu)
    spec = load_spec(model)
    layout = build_layout(spec, kv_dtype, tp)
    weights = estimate_weights(spec, quantization)
    constants, overlap = engine_constants(CONSTANTS, engine), True
    if timing_profile is not None:
        from kvplan.model.timing_profile import profile_option

        _, constants, overlap = profile_option(timing_profile)
    from kvplan.model.parallel import Parallelism, check, check_degrees

    check_degrees(dp, pp)
    par = Parallelism(tp, dp, pp, enable_expert_parallel)
    check(spec, par)
    if sp is not None and not par.plain:
        raise UsageError("models speculative decoding on tensor parallelism only (not --dp, --pp or "
                         "--enable-expert-parallel yet)", field="--speculative")
    if engine != "vllm" and not par.plain:
        raise UsageError("is vLLM's parallelism (kvplan/model/parallel.py); SGLang's is not modelled yet",
                         field="--dp" if dp != 1 else "--pp" if pp != 1 else "--enable-expert-parallel")
    started = _sglang_startup(spec, layout, weights, gpu_spec, tp, context) if engine == "sglang" else None
    if chunk is None:  # vLLM's 8,192, or the chunked_prefill_size SGLang starts with on this GPU
        chunk = 8192 if started is None else started.chunked_prefill_size
    extra = {"--all2all-backend": all2all_backend, "--expert-imbalance": expert_imbalance,
             "--enable-dbo": enable_dbo or None, "--network-gbps": network_gbps}
    if par.plain:
        for flag, value in extra.items():
            if value is not None:
                raise UsageError("applies with --dp, --pp or --enable-expert-parallel", field=flag)
        report = step_report(spec, layout, weights, gpu_spec, tp=tp, batch=batch, context=context, chunk=chunk,
                             enforce_eager=enforce_eager, constants=constants, async_scheduling=overlap)
        report["engine"] = engine
    else:
        report = _parallel_report(spec, layout, weights, gpu_spec, par, batch=batch, context=context, chunk=chunk,
                                  kv_dtype=kv_dtype, enforce_eager=enforce_eager, constants=constants,
                                  overlap=overlap, all2all_backend=all2all_backend,
                                  expert_imbalance=expert_imbalance, enable_dbo=enable_dbo,
                                  network_gbps=network_gbps)
        report["engine"] = engine
        report["timing_profile"] = timing_profile
        report["memory"] = _parallel_memory(spec, weights, gpu_spec, par, kv_dtype, batch, context, chunk,
                                            enforce_eager)
        return report
    report["timing_profile"] = timing_profile
    if sp is not None:
        report["speculative"] = _speculative(spec, layout, weights, gpu_spec, tp, enforce_eager, constants, overlap,
                                             sp, batch, context, serial_host=engine == "sglang")
        if engine == "sglang":  # SGLang allocates the drafts' slots within the step (kvplan/sim/sglang.py)
            from kvplan.model.sglang_memory import draft_tokens

            report["speculative"]["lookahead_slots"] = 0
            report["speculative"]["decode_buffer_tokens"] = draft_tokens(sp.k)
    report["memory"] = (_sglang_memory(spec, started, batch, context) if started is not None
                        else _memory(spec, layout, weights, gpu_spec, tp, batch, context, chunk, enforce_eager))
    return report


def _speculative(spec, layout, weights, gpu, tp, enforce_eager, constants, overlap, sp, batch, context,
                 serial_host: bool = False) -> dict:
    """The decode step with speculation (kvplan/model/speculative.py), beside the plain one;
    `serial_host`: SGLang's EAGLE worker, which speculates with its overlap scheduler off
    (kvplan/sim/sglang.py), the plain step keeping it."""
    from kvplan.model.speculative import speculative_section
    from kvplan.model.step_time import step_model

    target = step_model(spec, layout, weights, gpu, tp, enforce_eager=enforce_eager, constants=constants,
                        async_scheduling=overlap)
    per_token = [(g.bytes_per_token, g.tokens_held(context)) for g in layout.groups if g.bytes_per_token]
    total = sum(b for b, _ in per_token)
    read = sum(b * held for b, held in per_token) // total if total else context
    return speculative_section(spec, layout, weights, target, sp, batch=batch, read=read, serial_host=serial_host)


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



def _sglang_startup(spec, layout, weights, gpu, tp, context):
    """SGLang's start-up on this GPU at its defaults (kvplan size --engine sglang), its context
    at least `context`: the prefill chunk and the pool the step is checked against."""
    from kvplan.model.sglang_memory import SGLANG_RELEASE, model_identity, startup_on

    return startup_on(gpu, layout=layout, weights=weights.bytes_per_gpu(tp, gpu), tp=tp,
                      context_len=max(context, spec.max_context or context), release=SGLANG_RELEASE,
                      **model_identity(spec))


def _sglang_memory(spec, m, batch, context) -> dict:
    """Whether the decode step's batch fits SGLang's pool `m` (what `kvplan size --engine sglang`
    prints): `batch` x `context` tokens within max_total_num_tokens (on a hybrid SWA pool within
    the smaller of its two pools: sglang_memory rule 5), and `batch` within max_running_requests."""
    beyond = spec.max_context is not None and context > spec.max_context
    concurrency = min(m.serving_tokens // max(context, 1), m.max_running_requests) if m.starts else 0
    return {"batch_kv_bytes": batch * context * m.cell_size, "kv_pool_bytes": m.kv_pool if m.starts else 0,
            "max_concurrency": concurrency, "fits": m.starts and concurrency >= batch and not beyond,
            "reason": m.reason, "model_context": spec.max_context, "beyond_context": beyond,
            "max_total_num_tokens": m.max_total_num_tokens, "max_running_requests": m.max_running_requests}


def _parallel_report(spec, layout, weights, gpu, par, *, batch, context, chunk, kv_dtype, enforce_eager, constants,
                     overlap, all2all_backend, expert_imbalance, enable_dbo, network_gbps) -> dict:
    """`kvplan step` with --dp / --pp / --enable-expert-parallel (kvplan/model/parallel_step.py): the
    slowest stage's terms, with the ones parallelism adds, and the deployment's throughput."""
    from kvplan.model.parallel_step import ALL2ALL_DEFAULT, EXPERT_IMBALANCE, ParallelStep

    if network_gbps is not None and not 1 <= network_gbps <= 10_000:
        raise UsageError(f"expected Gb/s per GPU from 1 to 10,000, got {network_gbps}", field="--network-gbps")
    model = ParallelStep(spec, weights, gpu, par, kv_dtype=kv_dtype, enforce_eager=enforce_eager, constants=constants,
                         async_scheduling=overlap, all2all_backend=all2all_backend or ALL2ALL_DEFAULT,
                         expert_imbalance=EXPERT_IMBALANCE if expert_imbalance is None else expert_imbalance,
                         enable_dbo=enable_dbo,
                         network_bytes_per_s=None if network_gbps is None else network_gbps * 1e9 / 8)
    out = model.report(batch=batch, context=context, chunk=chunk)
    base = model.stages[out["parallel"]["decode_slowest_stage"]][2]
    c = base.constants
    return {
        "model": spec.name, "gpu": gpu.name, "tp": par.tp, "batch": batch, "context": context, "chunk": chunk,
        "enforce_eager": enforce_eager, "kv_dtype": layout.kv_dtype, "weights_scheme": weights.scheme,
        "fp8_compute": base.peak_flops == gpu.peak_fp8_flops and gpu.peak_fp8_flops > 0,
        "decode_s": out["decode"], "decode_tokens_per_s": out["decode_tokens_per_s"],
        "decode_itl_s": out["decode_itl_s"],
        "prefill_s": out["prefill"], "prefill_tokens_per_s": out["prefill_tokens_per_s"],
        "api_server_s": {"per_request": c.frontend_latency_s,
                         "while_decode_streams": api_server_s(c, out["decode_tokens_per_s"]),
                         "per_streamed_token": c.stream_token_s,
                         "intake_one_at_a_time": c.frontend_request_s},
        "constants": c.to_dict(),
        "parallel": out["parallel"],
    }


def _parallel_memory(spec, weights, gpu, par, kv_dtype, batch, context, chunk, enforce_eager) -> dict:
    """_memory for a parallel deployment: the pool of one DP rank's pipeline (parallel_size.py)."""
    from kvplan.model.parallel_size import parallel_fit
    from kvplan.model.vllm_memory import EngineOptions

    fit, _, _ = parallel_fit(spec, par, weights, gpu=gpu, kv_dtype=kv_dtype, tokens=context, batch=batch,
                             block_size=16, kv_memory=None, engine="vllm",
                             options=EngineOptions(max_num_batched_tokens=chunk, enforce_eager=enforce_eager),
                             gpu_memory_utilization=None, mxfp4_backend="auto")
    beyond = spec.max_context is not None and context > spec.max_context
    return {"batch_kv_bytes": fit.batch_kv_bytes, "kv_pool_bytes": fit.kv_pool_bytes,
            "max_concurrency": fit.max_concurrency, "fits": fit.fits and not beyond, "reason": fit.reason,
            "model_context": spec.max_context, "beyond_context": beyond}

