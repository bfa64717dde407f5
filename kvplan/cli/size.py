"""`kvplan size MODEL`: KV bytes per token and per request, and what fits on a GPU."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from kvplan.cli.options import JsonOpt, KvDtypeOpt
from kvplan.model.vllm_memory import VLLM_RELEASE


def size(
    model: Annotated[str, typer.Argument(help="Model id (catalog, HF cache or hub) or path to a config.json.")],
    tokens: Annotated[Optional[str], typer.Option("--tokens", "--max-model-len", help="Tokens per request, vLLM's max_model_len: 8192, 32k (32,000) or 32K (32,768), as vLLM reads them (default: the model's context).")] = None,
    kv_dtype: KvDtypeOpt = "auto",
    tp: Annotated[str, typer.Option("--tp", help="Tensor-parallel degree, or a list to compare: 1,2,4.")] = "1",
    batch: Annotated[int, typer.Option(help="Concurrent requests to check.")] = 1,
    gpu: Annotated[Optional[str], typer.Option(help="GPU from the catalog (see `kvplan gpus`), or a list to compare: H100-80GB,H200,L40S.")] = None,
    gpu_memory_utilization: Annotated[Optional[float], typer.Option(help="Share of GPU memory vLLM may use, with --gpu (default: the release's, 0.92 since vLLM 0.20, 0.9 before; 0.92 with --engine none).")] = None,
    kv_memory: Annotated[Optional[str], typer.Option(help="The KV pool per GPU with its unit, e.g. 40GiB or 40GB, as vLLM's --kv-cache-memory-bytes (with --gpu: vLLM's batch defaults for it).")] = None,
    block_size: Annotated[int, typer.Option(help="Paged KV block size in tokens.")] = 16,
    engine: Annotated[str, typer.Option(help="vllm: the KV pool vLLM will log at start-up, and whether it starts; sglang: SGLang's pool (max_total_num_tokens), max_running_requests and chunked_prefill_size, with --gpu; none: GPU memory x utilization less the weights.")] = "vllm",
    quantization: Annotated[Optional[str], typer.Option(help="vLLM's online quantization of a bf16 checkpoint: fp8.")] = None,
    max_num_batched_tokens: Annotated[Optional[str], typer.Option(help="vLLM's --max-num-batched-tokens, e.g. 8192 or 8K (default: vLLM's for the GPU).")] = None,
    max_num_seqs: Annotated[Optional[int], typer.Option(help="vLLM's --max-num-seqs (default: vLLM's for the GPU).")] = None,
    enforce_eager: Annotated[bool, typer.Option("--enforce-eager", help="vLLM's --enforce-eager: no CUDA graphs.")] = False,
    vllm_version: Annotated[Optional[str], typer.Option(help=f"The vLLM release whose rules apply (0.9 on; from 0.20 CUDA graphs come out of the pool; default {VLLM_RELEASE}).")] = None,
    enable_prefix_caching: Annotated[bool, typer.Option("--enable-prefix-caching/--no-enable-prefix-caching", help="vLLM's prefix caching (on by default); hybrid Mamba-style models then keep two state pages per request.")] = True,
    flashinfer: Annotated[bool, typer.Option("--flashinfer/--no-flashinfer", help="FlashInfer installed where vLLM runs (vLLM's Docker image has it; a pip install of 0.9-0.11.0 only with the [flashinfer] extra). In 0.9-0.11.0 it decides the profile's sampler memory: vLLM logs 'Using FlashInfer for top-p & top-k sampling' or 'FlashInfer is not available'.")] = True,
    allow_long_max_model_len: Annotated[bool, typer.Option("--allow-long-max-model-len", help="As vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN=1: a --tokens above the model's context starts (without it vLLM refuses it).")] = False,
    mxfp4_backend: Annotated[str, typer.Option(help="The kernels vLLM runs MXFP4 experts (gpt-oss) with, which decide their padding per GPU: auto (vLLM's pick: Marlin below compute capability 9, Triton on Hopper, FlashInfer on Blackwell), marlin (VLLM_MXFP4_USE_MARLIN=1, or a Hopper install without triton_kernels: its log warns of weight-only FP4), triton or flashinfer.")] = "auto",
    mem_fraction_static: Annotated[Optional[float], typer.Option(help="SGLang's --mem-fraction-static, with --engine sglang (default: SGLang's for the GPU and TP).")] = None,
    chunked_prefill_size: Annotated[Optional[int], typer.Option(help="SGLang's --chunked-prefill-size, with --engine sglang (default: SGLang's for the GPU).")] = None,
    max_running_requests: Annotated[Optional[int], typer.Option(help="SGLang's --max-running-requests, with --engine sglang (default: from the pool).")] = None,
    swa_full_tokens_ratio: Annotated[Optional[float], typer.Option(help="SGLang's --swa-full-tokens-ratio, with --engine sglang, for a model on its hybrid sliding-window pool (Llama 4): the sliding layers' tokens per full layers' token (default 0.8).")] = None,
    sglang_version: Annotated[Optional[str], typer.Option(help="The SGLang release whose rules apply, with --engine sglang: before 0.4.7 the fraction by TP, 0.4.7-0.5.2 a reserve by GPU memory, 0.5.3 on (the default) a reserve from the chunked prefill and CUDA graph sizes.")] = None,
    speculative: Annotated[Optional[str], typer.Option(help="With --engine sglang: a server speculating with eagle, eagle3 or mtp (SGLang's --speculative-algorithm; NEXTN is mtp), a chain of --num-speculative-tokens drafts: its pool headroom, 2 GiB more reserved, max_running_requests 48.")] = None,
    num_speculative_tokens: Annotated[Optional[int], typer.Option(help="With --speculative: SGLang's --speculative-num-steps (topk 1; default 3).")] = None,
    dp: Annotated[int, typer.Option("--dp", "--data-parallel-size", help="vLLM's --data-parallel-size: copies of attention and dense layers, each rank its own scheduler and KV pool; an MoE's experts split over tp x dp.")] = 1,
    pp: Annotated[int, typer.Option("--pp", "--pipeline-parallel-size", help="vLLM's --pipeline-parallel-size: stages of consecutive layers, each holding its own layers' KV.")] = 1,
    enable_expert_parallel: Annotated[bool, typer.Option("--enable-expert-parallel", help="vLLM's --enable-expert-parallel: whole experts split over EP = tp x dp ranks instead of every expert tensor-split.")] = False,
    json: JsonOpt = False,
) -> None:
    """Bytes of KV per token and per request, and what fits on a GPU.

    Example: kvplan size meta-llama/Meta-Llama-3-8B --gpu H100-80GB --tokens 8192
    """
    from kvplan.model.size import size as size_of, size_grid, parse_list
    from kvplan.model.sglang_size import refuse_other_engine

    sglang_options = dict(mem_fraction_static=mem_fraction_static, chunked_prefill_size=chunked_prefill_size,
                          max_running_requests=max_running_requests, sglang_version=sglang_version,
                          swa_full_tokens_ratio=swa_full_tokens_ratio)
    given = dict(gpu_memory_utilization=gpu_memory_utilization, kv_memory=kv_memory, block_size=block_size,
                 max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, enforce_eager=enforce_eager,
                 enable_prefix_caching=enable_prefix_caching, flashinfer=flashinfer,
                 allow_long_max_model_len=allow_long_max_model_len, mxfp4_backend=mxfp4_backend, **sglang_options)
    refuse_other_engine(engine, given, vllm_version_given=vllm_version is not None)
    if engine != "sglang" and (speculative is not None or num_speculative_tokens is not None):
        from kvplan.errors import UsageError

        raise UsageError("sizes SGLang's start-up with speculation (--engine sglang); vLLM's pool with a draft is a "
                         "serve workload's `speculative:` (its draft's weights and KV taken from the pool)",
                         field="--speculative" if speculative is not None else "--num-speculative-tokens")
    if engine == "sglang" and (dp != 1 or pp != 1 or enable_expert_parallel):
        from kvplan.errors import UsageError

        flag = "--dp" if dp != 1 else "--pp" if pp != 1 else "--enable-expert-parallel"
        raise UsageError("is vLLM's parallelism (kvplan/model/parallel.py); SGLang's is not modelled yet", field=flag)
    if engine == "sglang":
        _size_sglang(model, gpu, tp, tokens, kv_dtype, quantization, batch,
                     {**sglang_options, "speculative": speculative, "num_speculative_tokens": num_speculative_tokens},
                     json)
        return
    vllm_version = vllm_version or VLLM_RELEASE
    options = dict(tokens=tokens, kv_dtype=kv_dtype, batch=batch, gpu_memory_utilization=gpu_memory_utilization,
                   kv_memory=kv_memory, block_size=block_size, engine=engine, quantization=quantization,
                   max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                   enforce_eager=enforce_eager, vllm_version=vllm_version, enable_prefix_caching=enable_prefix_caching,
                   flashinfer=flashinfer, allow_long_max_model_len=allow_long_max_model_len,
                   mxfp4_backend=mxfp4_backend)
    if dp != 1 or pp != 1 or enable_expert_parallel:  # only then: outputs without them stay as they were
        options.update(dp=dp, pp=pp, enable_expert_parallel=enable_expert_parallel)
    gpus = parse_list(gpu, "--gpu") if gpu is not None else [None]
    tps = [int(t) for t in parse_list(tp, "--tp", integers=True)]
    if len(gpus) * len(tps) > 1:
        rows = size_grid(model, gpus, tps, options)
        if json:
            from kvplan.report.output import emit_json

            emit_json({"model": model, "grid": rows})
        else:
            from kvplan.report.size_view import render_grid

            render_grid(model, rows)
            if "dp" in options:
                from kvplan.report.output import console

                console().print("with --dp/--pp/--enable-expert-parallel each row is a GPU of the pipeline stage that "
                                "sets the pool, its concurrency that of one DP rank (one GPU and TP degree alone: "
                                "the stages and totals)")
        return
    run = size_of(model, tp=tps[0], gpu=gpus[0], **options)
    if json:
        from kvplan.report.output import emit_json

        emit_json(run.to_dict())
    else:
        from kvplan.report.size_view import render_size

        render_size(run.report, run.layout, list(run.notes), run.concurrency_at, run.would_fit)
        if run.parallel is not None:
            from kvplan.report.parallel_view import render_parallel

            render_parallel(run.parallel)


def _size_sglang(model: str, gpu: str | None, tp: str, tokens: str | None, kv_dtype: str, quantization: str | None,
                 batch: int, options: dict, json: bool) -> None:
    """`kvplan size --engine sglang`: SGLang's start-up on each GPU and TP degree asked for."""
    from kvplan.errors import UsageError
    from kvplan.model.size import parse_list
    from kvplan.model.sglang_size import sglang_size
    from kvplan.units import parse_count

    if gpu is None:
        raise UsageError("SGLang's pool depends on the GPU: give --gpu", field="--engine")
    if batch != 1:
        raise UsageError("is vLLM's sizing of a batch; SGLang reports max_running_requests", field="--batch")
    context = parse_count(tokens, field="--tokens") if tokens is not None else None
    gpus = parse_list(gpu, "--gpu")
    tps = [int(t) for t in parse_list(tp, "--tp", integers=True)]
    runs = [sglang_size(model, gpu=g, tp=t, kv_dtype=kv_dtype, quantization=quantization, context_length=context,
                        **options) for g in gpus for t in tps]
    if json:
        from kvplan.report.output import emit_json

        emit_json(runs[0].to_dict() if len(runs) == 1 else {"model": model, "engine": "sglang",
                                                           "grid": [r.to_dict() for r in runs]})
        return
    from kvplan.report.size_view import render_sglang

    for run in runs:
        render_sglang(run)
