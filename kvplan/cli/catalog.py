"""`kvplan models` and `kvplan gpus`: the bundled model catalog and the GPU catalog."""

from __future__ import annotations

from kvplan.cli.options import JsonOpt


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


def gpus(json: JsonOpt = False) -> None:
    """List the GPU catalog: memory, memory as CUDA reports it, HBM bandwidth, peak dense bf16."""
    from kvplan.model.gpus import GPUS
    from kvplan.report.output import console, emit_json, print_table
    from kvplan.text import terminal
    from kvplan.units import format_bytes

    rows = [dict(name=g.name, memory_bytes=g.memory_bytes, cuda_memory_bytes=g.cuda_memory_bytes,
                 hbm_bytes_per_s=g.hbm_bytes_per_s, peak_bf16_flops=g.peak_bf16_flops) for g in GPUS.values()]
    if json:
        emit_json({"gpus": rows})
        return
    from rich.table import Table

    table = Table(title="GPU catalog", title_justify="left")
    for col in ("GPU", "memory", "as CUDA reports it", "HBM bandwidth", "peak bf16"):
        table.add_column(col, justify="left" if col == "GPU" else "right")
    for r in rows:
        table.add_row(terminal(r["name"]), format_bytes(r["memory_bytes"]), format_bytes(r["cuda_memory_bytes"]),
                      f"{r['hbm_bytes_per_s'] / 1e12:.2f} TB/s", f"{r['peak_bf16_flops'] / 1e12:.0f} TFLOP/s")
    print_table(console(), table)  # folded on a narrow console: no number cut
