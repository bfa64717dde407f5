"""`kvplan step MODEL --gpu G`: the time of one decode step and one prefill chunk, term by term."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from kvplan.cli.options import AcceptanceOpt, JsonOpt, KvDtypeOpt, NumSpeculativeTokensOpt, SpeculativeOpt, TimingProfileOpt, TpOpt


def step(
    model: Annotated[str, typer.Argument(help="Model id (catalog, HF cache or hub) or path to a config.json.")],
    gpu: Annotated[str, typer.Option(help="GPU from the catalog (see `kvplan gpus`).")] = "H100-80GB",
    tp: TpOpt = 1,
    batch: Annotated[int, typer.Option(help="Decoding requests in the step.")] = 64,
    context: Annotated[int, typer.Option(help="Tokens each decoding request holds.")] = 4096,
    chunk: Annotated[Optional[int], typer.Option(help="Tokens of the prefill chunk (vLLM's max_num_batched_tokens; default 8192, with --engine sglang SGLang's chunked_prefill_size for the GPU).")] = None,
    kv_dtype: KvDtypeOpt = "auto",
    quantization: Annotated[Optional[str], typer.Option(help="vLLM's online quantization of a bf16 checkpoint: fp8.")] = None,
    enforce_eager: Annotated[bool, typer.Option("--enforce-eager", help="vLLM's --enforce-eager: no CUDA graphs.")] = False,
    engine: Annotated[str, typer.Option(help="vllm, or sglang: SGLang's host overheads and API server, and its pool for the batch check (kvplan size --engine sglang).")] = "vllm",
    timing_profile: TimingProfileOpt = None,
    speculative: SpeculativeOpt = None,
    num_speculative_tokens: NumSpeculativeTokensOpt = None,
    acceptance: AcceptanceOpt = None,
    dp: Annotated[int, typer.Option("--dp", "--data-parallel-size", help="vLLM's --data-parallel-size: --batch and --chunk are per DP rank; an MoE's experts split over tp x dp.")] = 1,
    pp: Annotated[int, typer.Option("--pp", "--pipeline-parallel-size", help="vLLM's --pipeline-parallel-size: stages in series, one batch in flight per stage.")] = 1,
    enable_expert_parallel: Annotated[bool, typer.Option("--enable-expert-parallel", help="vLLM's --enable-expert-parallel: whole experts over EP = tp x dp ranks.")] = False,
    all2all_backend: Annotated[Optional[str], typer.Option(help="vLLM's --all2all-backend with --dp > 1 on an MoE: allgather_reducescatter (vLLM's default), deepep_high_throughput, deepep_low_latency.")] = None,
    expert_imbalance: Annotated[Optional[float], typer.Option(help="The busiest EP rank's expert work over the mean (default 1.3, without EPLB; 1.0-1.1 with it).")] = None,
    enable_dbo: Annotated[bool, typer.Option("--enable-dbo", help="vLLM's --enable-dbo: dual-batch overlap hides part of the all-to-all under compute (half the shorter of the two).")] = False,
    network_gbps: Annotated[Optional[float], typer.Option(help="Network per GPU across nodes in Gb/s (default: the GPU catalog's, else 400).")] = None,
    json: JsonOpt = False,
) -> None:
    """The step-time model shown: one decode step and one prefill chunk, term by term.

    Example: kvplan step meta-llama/Llama-3.1-8B-Instruct --gpu H100-80GB --tp 2 --batch 64 --context 4096

    With --speculative eagle3 --num-speculative-tokens 3: the verify step of batch x 4 tokens, the
    draft's passes, the tokens a step emits, and the time per output token against no speculation.
    """
    from kvplan.model.step import step_of

    report = step_of(model, gpu=gpu, tp=tp, batch=batch, context=context, chunk=chunk, kv_dtype=kv_dtype,
                     quantization=quantization, enforce_eager=enforce_eager,
                     timing_profile=None if timing_profile is None else str(timing_profile), engine=engine,
                     **({} if dp == 1 and pp == 1 and not enable_expert_parallel and all2all_backend is None
                        and expert_imbalance is None and not enable_dbo and network_gbps is None else
                        dict(dp=dp, pp=pp, enable_expert_parallel=enable_expert_parallel,
                             all2all_backend=all2all_backend, expert_imbalance=expert_imbalance,
                             enable_dbo=enable_dbo, network_gbps=network_gbps)),
                     speculative=speculative, num_speculative_tokens=num_speculative_tokens, acceptance=acceptance)
    if json:
        from kvplan.report.output import emit_json

        emit_json(report)
    else:
        from kvplan.report.step_view import render_step

        render_step(report)
        if "parallel" in report:
            from kvplan.report.parallel_view import render_parallel_step

            render_parallel_step(report)
