"""`kvplan size MODEL`: KV bytes per token and per request, and what fits on a GPU."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from kvplan.cli.options import JsonOpt, KvDtypeOpt


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
    engine: Annotated[str, typer.Option(help="vllm: the KV pool vLLM will log at start-up, and whether it starts; none: GPU memory x utilization less the weights.")] = "vllm",
    quantization: Annotated[Optional[str], typer.Option(help="vLLM's online quantization of a bf16 checkpoint: fp8.")] = None,
    max_num_batched_tokens: Annotated[Optional[str], typer.Option(help="vLLM's --max-num-batched-tokens, e.g. 8192 or 8K (default: vLLM's for the GPU).")] = None,
    max_num_seqs: Annotated[Optional[int], typer.Option(help="vLLM's --max-num-seqs (default: vLLM's for the GPU).")] = None,
    enforce_eager: Annotated[bool, typer.Option("--enforce-eager", help="vLLM's --enforce-eager: no CUDA graphs.")] = False,
    vllm_version: Annotated[str, typer.Option(help="The vLLM release whose rules apply (0.9 on; from 0.20 CUDA graphs come out of the pool).")] = "0.29",
    enable_prefix_caching: Annotated[bool, typer.Option("--enable-prefix-caching/--no-enable-prefix-caching", help="vLLM's prefix caching (on by default); hybrid Mamba-style models then keep two state pages per request.")] = True,
    flashinfer: Annotated[bool, typer.Option("--flashinfer/--no-flashinfer", help="FlashInfer installed where vLLM runs (vLLM's Docker image has it; a pip install of 0.9-0.11.0 only with the [flashinfer] extra). In 0.9-0.11.0 it decides the profile's sampler memory: vLLM logs 'Using FlashInfer for top-p & top-k sampling' or 'FlashInfer is not available'.")] = True,
    allow_long_max_model_len: Annotated[bool, typer.Option("--allow-long-max-model-len", help="As vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN=1: a --tokens above the model's context starts (without it vLLM refuses it).")] = False,
    mxfp4_backend: Annotated[str, typer.Option(help="The kernels vLLM runs MXFP4 experts (gpt-oss) with, which decide their padding per GPU: auto (vLLM's pick: Marlin below compute capability 9, Triton on Hopper, FlashInfer on Blackwell), marlin (VLLM_MXFP4_USE_MARLIN=1, or a Hopper install without triton_kernels: its log warns of weight-only FP4), triton or flashinfer.")] = "auto",
    json: JsonOpt = False,
) -> None:
    """Bytes of KV per token and per request, and what fits on a GPU.

    Example: kvplan size meta-llama/Meta-Llama-3-8B --gpu H100-80GB --tokens 8192
    """
    from kvplan.model.size import size as size_of, size_grid, parse_list

    options = dict(tokens=tokens, kv_dtype=kv_dtype, batch=batch, gpu_memory_utilization=gpu_memory_utilization,
                   kv_memory=kv_memory, block_size=block_size, engine=engine, quantization=quantization,
                   max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                   enforce_eager=enforce_eager, vllm_version=vllm_version, enable_prefix_caching=enable_prefix_caching,
                   flashinfer=flashinfer, allow_long_max_model_len=allow_long_max_model_len,
                   mxfp4_backend=mxfp4_backend)
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
        return
    run = size_of(model, tp=tps[0], gpu=gpus[0], **options)
    if json:
        from kvplan.report.output import emit_json

        emit_json(run.to_dict())
    else:
        from kvplan.report.size_view import render_size

        render_size(run.report, run.layout, list(run.notes), run.concurrency_at, run.would_fit)
