"""`kvplan calibrate RESULT.json ...`: fit the step-time constants to your own `vllm bench serve`
runs and write them as a timing profile that simulate, plan, step and fleets read."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kvplan.cli.options import JsonOpt, KvDtypeOpt, TpOpt
from kvplan.errors import UsageError

DEFAULT_FIT = "bandwidth_efficiency,gemm_efficiency,attention_efficiency,step_overhead_s,request_overhead_s,frontend_latency_s"


def calibrate(
    results: Annotated[list[Path], typer.Argument(help="Result files of vllm bench serve --save-result (--save-detailed for per-request lengths; --append-result files hold a run a line).")],
    model: Annotated[str, typer.Option(help="The model the server ran (any kvplan size argument).")],
    gpu: Annotated[str, typer.Option(help="The GPU it ran on (kvplan gpus).")],
    out: Annotated[Path, typer.Option(help="The timing profile to write (YAML).")],
    tp: TpOpt = 1,
    kv_dtype: KvDtypeOpt = "auto",
    max_num_seqs: Annotated[Optional[int], typer.Option("--max-num-seqs", help="The server's --max-num-seqs (default vllm serve's for the GPU).")] = None,
    max_num_batched_tokens: Annotated[Optional[int], typer.Option("--max-num-batched-tokens", help="The server's --max-num-batched-tokens.")] = None,
    vllm_version: Annotated[str, typer.Option("--vllm-version", help="The vLLM release the server ran (async scheduling from 0.14; kvplan follows 0.29).")] = "0.29",
    fit: Annotated[str, typer.Option(help="The constants to fit (the rest keep the shipped values).")] = DEFAULT_FIT,
    workers: Annotated[int, typer.Option(help="Runs simulated in parallel.")] = 1,
    json: JsonOpt = False,
) -> None:
    """Fit the step-time model to your own vllm bench serve results and write a timing profile.

    Example: kvplan calibrate run-c8.json run-c32.json --model openai/gpt-oss-120b --gpu H200 --tp 8 --vllm-version 0.15 --out h200.yaml
    """
    from kvplan.calibrate.bench_files import Server
    from kvplan.calibrate.profile import calibrate_runs
    from kvplan.model.step_time import SCHEDULER_ASYNC_FROM
    from kvplan.report.files import check_writable, write_outputs
    from kvplan.report.output import emit_json

    if not 1 <= workers <= 64:
        raise UsageError(f"expected 1 to 64 workers, got {workers}", field="--workers")
    from kvplan.fileio import note_input

    for path in results:  # recorded before --out is checked: --out may never be one of them
        if Path(path).is_file():
            note_input(path)
    check_writable(out, "--out")
    server = Server(model, gpu, tp, kv_dtype, max_num_seqs, max_num_batched_tokens,
                    async_scheduling=_release(vllm_version) >= SCHEDULER_ASYNC_FROM)
    doc, profile_text = calibrate_runs(server, [str(p) for p in results], [s.strip() for s in fit.split(",") if s.strip()],
                                       workers=workers)
    write_outputs([(out, lambda tmp: Path(tmp).write_text(profile_text, encoding="utf-8"), "--out")])
    doc["profile"] = str(out)
    if json:
        emit_json(doc)
    else:
        from kvplan.report.calibrate_view import render_calibration

        render_calibration(doc)


def _release(text: str) -> tuple[int, int]:
    from kvplan.model.vllm_memory import release_number

    number = release_number(text)
    if number is None:
        raise UsageError(f"expected a release such as 0.15 or 0.15.1, got {text[:40]!r}", field="--vllm-version")
    return number
