"""The kvplan command line: thin typer commands that parse, call a library function, and report.

Every KvplanError (and every command-line usage error) becomes one line on stderr and exit code 2;
KVPLAN_DEBUG=1 shows the traceback instead. Heavy modules are imported inside the commands so
that `kvplan size` on a catalog model never imports numpy, torch, matplotlib or huggingface_hub.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from kvplan.errors import KvplanError, UsageError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Capacity planning and simulation for the KV cache of LLM serving.",
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
KvDtypeOpt = Annotated[str, typer.Option("--kv-dtype", help="auto, fp32, bf16, fp16, fp8, int8 or int4 (auto = the config's dtype).")]
TpOpt = Annotated[int, typer.Option("--tp", help="Tensor-parallel degree: KV heads split across GPUs.")]


@app.command()
def size(
    model: Annotated[str, typer.Argument(help="Model id (catalog, HF cache or hub) or path to a config.json.")],
    tokens: Annotated[Optional[int], typer.Option(help="Tokens per request (default: the model's context).")] = None,
    kv_dtype: KvDtypeOpt = "auto",
    tp: TpOpt = 1,
    batch: Annotated[int, typer.Option(help="Concurrent requests to check.")] = 1,
    gpu: Annotated[Optional[str], typer.Option(help="GPU from the catalog (see `kvplan gpus`).")] = None,
    gpu_memory_utilization: Annotated[float, typer.Option(help="Share of GPU memory for weights + KV (vLLM's default).")] = 0.92,
    kv_memory: Annotated[Optional[str], typer.Option(help="KV memory per GPU, e.g. 40GiB (instead of --gpu).")] = None,
    block_size: Annotated[int, typer.Option(help="Paged KV block size in tokens.")] = 16,
    json: JsonOpt = False,
) -> None:
    """Bytes of KV per token and per request, and what fits on a GPU.

    Example: kvplan size meta-llama/Meta-Llama-3-8B --gpu H100-80GB --tokens 8192
    """
    from kvplan.model.build import build_layout
    from kvplan.model.dtypes import KV_DTYPE_CHOICES
    from kvplan.model.fit import size_model
    from kvplan.model.resolve import load_spec
    from kvplan.model.weights import estimate_weights
    from kvplan.units import parse_size

    if kv_dtype not in KV_DTYPE_CHOICES:
        raise UsageError(f"expected one of {', '.join(KV_DTYPE_CHOICES)}, got {kv_dtype!r}", field="--kv-dtype")
    gpu_spec = _gpu(gpu)
    kv_bytes = parse_size(kv_memory, field="--kv-memory") if kv_memory is not None else None
    spec = load_spec(model)
    layout = build_layout(spec, kv_dtype, tp)
    weights = estimate_weights(spec)
    report = size_model(
        layout,
        tokens=tokens if tokens is not None else spec.max_context,
        batch=batch,
        block_size=block_size,
        weight_bytes=weights.bytes,
        params=weights.params,
        gpu=gpu_spec,
        gpu_memory_utilization=gpu_memory_utilization,
        kv_memory=kv_bytes,
    )
    notes = [spec.dtype_note] if spec.dtype_note else []
    if json:
        from kvplan.report.output import emit_json

        emit_json({**report.to_dict(), "notes": notes})
    else:
        from kvplan.report.size_view import render_size

        render_size(report, layout, notes)


def _gpu(name: Optional[str]):
    if name is None:
        return None
    from kvplan.model.gpus import get_gpu

    return get_gpu(name)


@app.command()
def models(json: JsonOpt = False) -> None:
    """List the bundled model catalog (usable offline)."""
    from kvplan.model.build import build_layout
    from kvplan.model.resolve import catalog_ids, load_spec

    rows = []
    for model_id in catalog_ids():
        spec = load_spec(model_id)
        layout = build_layout(spec)
        rows.append(dict(model=model_id, model_type=spec.model_type, num_layers=len(spec.layers),
                         bytes_per_token=layout.bytes_per_token, max_context=spec.max_context, dtype=spec.dtype))
    if json:
        from kvplan.report.output import emit_json

        emit_json({"models": rows})
    else:
        from kvplan.report.size_view import render_models

        render_models(rows)


@app.command()
def gpus(json: JsonOpt = False) -> None:
    """List the GPU catalog: memory, HBM bandwidth and peak dense bf16 FLOP/s."""
    from kvplan.model.gpus import GPUS
    from kvplan.report.output import console, emit_json
    from kvplan.units import format_bytes

    rows = [dict(name=g.name, memory_bytes=g.memory_bytes, hbm_bytes_per_s=g.hbm_bytes_per_s,
                 peak_bf16_flops=g.peak_bf16_flops) for g in GPUS.values()]
    if json:
        emit_json({"gpus": rows})
        return
    from rich.table import Table

    table = Table(title="GPU catalog", title_justify="left")
    for col in ("GPU", "memory", "HBM bandwidth", "peak bf16"):
        table.add_column(col, justify="left" if col == "GPU" else "right")
    for r in rows:
        table.add_row(r["name"], format_bytes(r["memory_bytes"]), f"{r['hbm_bytes_per_s'] / 1e12:.2f} TB/s",
                      f"{r['peak_bf16_flops'] / 1e12:.0f} TFLOP/s")
    console().print(table)


def _cli_error_types() -> tuple[type[BaseException], ...]:
    """Usage-error classes of the installed typer (its own vendored click in 0.29+, else click)."""
    found = [t for t in (getattr(typer, "TyperException", None),) if t is not None]
    try:
        import click

        found.append(click.exceptions.ClickException)
    except ImportError:
        pass
    return tuple(found)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app and turn every input error into one line and exit code 2."""
    debug = os.environ.get("KVPLAN_DEBUG", "") not in ("", "0")
    try:
        code = app(args=argv, prog_name="kvplan", standalone_mode=False)
    except KvplanError as exc:
        if debug:
            raise
        _fail(str(exc))
    except (typer.Abort, KeyboardInterrupt):
        _fail("aborted")
    except BrokenPipeError:
        sys.stderr.close()
        raise SystemExit(1)
    except _cli_error_types() as exc:
        if debug:
            raise
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        if type(exc).__name__ == "NoArgsIsHelpError":
            sys.stderr.write(message + "\n")
            raise SystemExit(2)
        _fail(message)
    raise SystemExit(code if isinstance(code, int) else 0)


def _fail(message: str) -> None:
    sys.stderr.write(f"kvplan: error: {' '.join(message.split())}\n")
    raise SystemExit(2)


__all__ = ["app", "main", "Path"]
