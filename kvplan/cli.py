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
    gpu_memory_utilization: Annotated[Optional[float], typer.Option(help="Share of GPU memory for weights + KV, with --gpu (default 0.92, vLLM's).")] = None,
    kv_memory: Annotated[Optional[str], typer.Option(help="KV memory per GPU, e.g. 40GiB (instead of --gpu).")] = None,
    block_size: Annotated[int, typer.Option(help="Paged KV block size in tokens.")] = 16,
    json: JsonOpt = False,
) -> None:
    """Bytes of KV per token and per request, and what fits on a GPU.

    Example: kvplan size meta-llama/Meta-Llama-3-8B --gpu H100-80GB --tokens 8192
    """
    from kvplan.model.size import size as size_of

    run = size_of(model, tokens=tokens, kv_dtype=kv_dtype, tp=tp, batch=batch, gpu=gpu,
                  gpu_memory_utilization=gpu_memory_utilization, kv_memory=kv_memory, block_size=block_size)
    if json:
        from kvplan.report.output import emit_json

        emit_json(run.to_dict())
    else:
        from kvplan.report.size_view import render_size

        render_size(run.report, run.layout, list(run.notes))


@app.command()
def simulate(
    workload: Annotated[Path, typer.Argument(help="Workload YAML file (see workloads/SCHEMA.md).")],
    json: JsonOpt = False,
    block_sizes: Annotated[Optional[str], typer.Option(help="Paged block-size sweep: a list (1,2,4,16) or a range of powers of two (1-64).")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="Write a chart (.png or .svg; needs matplotlib).")] = None,
    csv: Annotated[Optional[Path], typer.Option(help="Write one row per request (serve experiments).")] = None,
    rates: Annotated[Optional[str], typer.Option(help="Request-rate sweep, requests/s (serve experiments): 0.5,1,2,4.")] = None,
    latency_bound: Annotated[float, typer.Option(help="Normalized-latency bound (s/token) for the rate sweep.")] = 0.2,
    cache_blocks: Annotated[Optional[str], typer.Option(help="Prefix-cache sizes in blocks to sweep (prefix experiments): 1000,5000,20000.")] = None,
) -> None:
    """Replay a workload through contiguous and paged allocators and compare them.

    Example: kvplan simulate workloads/lesson.yaml --block-sizes 1-64 --plot sweep.png
    """
    from kvplan.sim.load import load

    options = _simulate_options(block_sizes, plot, csv, rates, latency_bound, cache_blocks)
    wl = load(workload)
    for option, value, allowed in (("--csv", csv, ("serve",)), ("--rates", rates, ("serve",)),
                                   ("--cache-blocks", cache_blocks, ("prefix",)),
                                   ("--block-sizes", block_sizes, ("capacity", "serve")),
                                   ("--plot", plot, ("capacity", "serve", "prefix"))):
        if value is not None and wl.experiment not in allowed:
            raise UsageError(f"applies to {' and '.join(allowed)} experiments, and {workload} is a "
                             f"{wl.experiment} experiment", field=option)
    if wl.experiment == "serve":
        from kvplan.cli_serve import simulate_serve

        simulate_serve(wl, json=json, plot=plot, csv=csv, rates=options["rates"],
                       latency_bound=latency_bound, block_sizes=options["block_sizes"])
    else:
        _simulate_document(wl, json, plot, options)


def _simulate_options(block_sizes, plot, csv, rates, latency_bound, cache_blocks) -> dict:
    """Check every option before any work, so a bad one costs nothing and writes nothing."""
    import math

    from kvplan.report.files import check_writable

    if plot is not None:
        check_writable(plot, "--plot")
        if plot.suffix.lower() not in (".png", ".svg"):
            raise UsageError(f"expected a .png or .svg file name, got {plot.name!r}", field="--plot")
    if csv is not None:
        check_writable(csv, "--csv")
    if not (math.isfinite(latency_bound) and latency_bound > 0):
        raise UsageError(f"expected a positive number, got {latency_bound}", field="--latency-bound")
    blocks = _numbers(cache_blocks, "--cache-blocks")
    if blocks and any(b != int(b) or b > 2**40 for b in blocks):
        raise UsageError(f"expected whole numbers of blocks, got {cache_blocks!r}", field="--cache-blocks")
    return {"block_sizes": _block_sizes(block_sizes), "rates": _numbers(rates, "--rates"),
            "cache_blocks": [int(b) for b in blocks] if blocks else None}


def _simulate_document(wl, as_json: bool, plot: Optional[Path], options: dict) -> None:
    """Capacity, prefix and sharing experiments: one document, then a table or JSON, and a chart."""
    from kvplan.report.files import atomic_write
    from kvplan.report.output import emit_json
    from kvplan.sim.load import document

    doc = document(wl, block_sizes=options["block_sizes"], cache_blocks=options["cache_blocks"])
    if wl.experiment == "capacity":
        from kvplan.report.capacity_view import plot_capacity as draw, render_capacity as render
    elif wl.experiment == "prefix":
        from kvplan.report.prefix_view import plot_prefix as draw, render_prefix as render
    else:
        from kvplan.report.prefix_view import render_sharing as render
    if plot is not None:
        atomic_write(plot, lambda tmp: draw(doc, tmp), field="--plot")
    if as_json:
        emit_json(doc)
    else:
        render(doc)


def _numbers(text: Optional[str], field: str) -> list[float] | None:
    if text is None:
        return None
    import math

    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"expected numbers separated by commas, got {text!r}", field=field) from None
    if not values or any(not math.isfinite(v) or v <= 0 for v in values):
        raise UsageError(f"expected positive numbers, got {text!r}", field=field)
    return values


def _block_sizes(text: Optional[str]) -> list[int] | None:
    """'1,2,4,16' or a range of powers of two '1-64'."""
    if text is None:
        return None
    bad = UsageError(f"expected block sizes like 1,2,4,16 or a range 1-64, got {text!r}", field="--block-sizes")
    try:
        if "-" in text:
            lo, hi = (int(v) for v in text.split("-", 1))
            sizes = [1 << k for k in range(0, 31) if lo <= (1 << k) <= hi]
        else:
            sizes = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise bad from None
    if not sizes or any(s < 1 or s > 1 << 20 for s in sizes):
        raise bad
    return sorted(set(sizes))


@app.command()
def validate(
    model: Annotated[str, typer.Argument(help="Model id or path to a config.json.")],
    layers: Annotated[int, typer.Option(help="Layers to build (the model's layer kinds are kept).")] = 2,
    block_size: Annotated[int, typer.Option(help="Paged KV block size in tokens.")] = 16,
    num_blocks: Annotated[Optional[int], typer.Option(help="Blocks in the pool (default: enough for the requests).")] = None,
    kv_dtype: KvDtypeOpt = "auto",
    tp: TpOpt = 1,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    json: JsonOpt = False,
) -> None:
    """Run real paged attention in torch and check kvplan's byte accounting against it.

    Needs the torch extra. Exit 1 when a check fails.
    Example: kvplan validate meta-llama/Meta-Llama-3-8B --layers 2 --device cpu
    """
    from kvplan.backends.torch import run_validation

    result = run_validation(model, layers=layers, block_size=block_size, num_blocks=num_blocks,
                            kv_dtype=kv_dtype, tp=tp, device=device)
    if json:
        from kvplan.report.output import emit_json

        emit_json(result.to_dict())
    else:
        from kvplan.report.validate_view import render_validation

        render_validation(result)
    if not result.ok:
        raise SystemExit(1)


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


from kvplan.cli_check import check  # noqa: E402 - registered beside the commands above

app.command()(check)


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


__all__ = ["app", "main"]
