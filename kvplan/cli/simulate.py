"""`kvplan simulate WORKLOAD`: check every option, load the workload, run its experiment, report.

Serve experiments go on in kvplan/cli/serve.py (progress, CSV, rate sweep); the others are one
document each, shown as a table or JSON, with an optional chart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kvplan.cli.options import JsonOpt
from kvplan.errors import UsageError


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
    from kvplan.experiments import load
    from kvplan.fileio import note_input

    note_input(workload)
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
        from kvplan.cli.serve import simulate_serve

        simulate_serve(wl, json=json, plot=plot, csv=csv, rates=options["rates"],
                       latency_bound=latency_bound, block_sizes=options["block_sizes"])
    else:
        _simulate_document(wl, json, plot, options)


def _simulate_options(block_sizes, plot, csv, rates, latency_bound, cache_blocks) -> dict:
    """Check every option before any work, so a bad one costs nothing and writes nothing."""
    import math

    import importlib.util

    from kvplan.report.files import check_writable, distinct_outputs

    if plot is not None:
        check_writable(plot, "--plot")
        if plot.suffix.lower() not in (".png", ".svg"):
            raise UsageError(f"expected a .png or .svg file name, got {plot.name!r}", field="--plot")
        if importlib.util.find_spec("matplotlib") is None:
            raise UsageError('needs matplotlib: pip install "kvplan[plot]"', field="--plot")
    if csv is not None:
        check_writable(csv, "--csv")
    distinct_outputs({"--plot": plot, "--csv": csv})
    if not (math.isfinite(latency_bound) and latency_bound > 0):
        raise UsageError(f"expected a positive number, got {latency_bound}", field="--latency-bound")
    blocks = _numbers(cache_blocks, "--cache-blocks")
    if blocks and any(b != int(b) or b > 2**40 for b in blocks):
        raise UsageError(f"expected whole numbers of blocks, got {cache_blocks!r}", field="--cache-blocks")
    return {"block_sizes": _block_sizes(block_sizes), "rates": _numbers(rates, "--rates"),
            "cache_blocks": [int(b) for b in blocks] if blocks else None}


def _simulate_document(wl, as_json: bool, plot: Optional[Path], options: dict) -> None:
    """Capacity, prefix and sharing experiments: one document, then a table or JSON, and a chart."""
    from kvplan.experiments import document
    from kvplan.report.files import atomic_write
    from kvplan.report.output import emit_json

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
