"""`kvplan simulate WORKLOAD`: check every option, load the workload, run its experiment, report.

Serve experiments go on in kvplan/cli/serve.py (progress, CSV, rate sweep); the others are one
document each, shown as a table or JSON, with an optional chart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kvplan.cli.options import JsonOpt, TimingProfileOpt
from kvplan.errors import UsageError


def simulate(
    workload: Annotated[Optional[str], typer.Argument(help="Workload YAML file (kvplan schema), or a bundled example's name (kvplan examples); leave it out to describe a serve run with --model and the flags below.")] = None,
    json: JsonOpt = False,
    block_sizes: Annotated[Optional[str], typer.Option(help="Paged block-size sweep: a list (1,2,4,16) or a range of powers of two (1-64).")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="Write a chart (.png or .svg; needs matplotlib).")] = None,
    csv: Annotated[Optional[Path], typer.Option(help="Write one row per request (serve and fleet experiments).")] = None,
    rates: Annotated[Optional[str], typer.Option(help="Request-rate sweep, requests/s (serve experiments): 0.5,1,2,4.")] = None,
    latency_bound: Annotated[float, typer.Option(help="Normalized-latency bound (s/token) for the rate sweep.")] = 0.2,
    cache_blocks: Annotated[Optional[str], typer.Option(help="Prefix-cache sizes in blocks to sweep (prefix experiments): 1000,5000,20000.")] = None,
    model: Annotated[Optional[str], typer.Option(help="Without a workload file: the model served (any kvplan size argument).")] = None,
    gpu: Annotated[Optional[str], typer.Option(help="Without a workload file: the GPU (default H100-80GB).")] = None,
    tp: Annotated[Optional[int], typer.Option(help="Without a workload file: tensor-parallel degree (default 1).")] = None,
    rate: Annotated[Optional[float], typer.Option(help="Without a workload file: Poisson arrivals, requests/s (default: all at once).")] = None,
    prompt: Annotated[Optional[str], typer.Option(help="Without a workload file: prompt tokens of every request (default 1000; 2k).")] = None,
    output: Annotated[Optional[str], typer.Option(help="Without a workload file: output tokens of every request (default 200).")] = None,
    count: Annotated[Optional[int], typer.Option(help="Without a workload file: requests (default 1000).")] = None,
    show_workload: Annotated[bool, typer.Option("--show-workload", help="Print the workload YAML a flag-only run uses (to stderr with --json).")] = False,
    timing_profile: TimingProfileOpt = None,
    engine: Annotated[Optional[str], typer.Option(help="Serve experiments: whose scheduler runs the requests, vllm or sglang (SGLang's: RadixAttention, lpm, retraction); instead of the workload's engine:. Without a workload file, sglang also takes SGLang's own start-up pool and limits.")] = None,
) -> None:
    """Replay a workload through contiguous and paged allocators and compare them.

    Example: kvplan simulate workloads/lesson.yaml --block-sizes 1-64 --plot sweep.png
    Example: kvplan simulate --model meta-llama/Llama-3.1-8B-Instruct --gpu L40S --rate 10 --prompt 1000 --output 200
    """
    from kvplan.experiments import load
    from kvplan.fileio import note_input

    options = _simulate_options(block_sizes, plot, csv, rates, latency_bound, cache_blocks)
    if engine is not None and engine not in ("vllm", "sglang"):
        raise UsageError(f"expected vllm or sglang, got {engine!r}", field="--engine")
    flags = {"--model": model, "--gpu": gpu, "--tp": tp, "--rate": rate, "--prompt": prompt, "--output": output,
             "--count": count, "--timing-profile": timing_profile}
    if workload is not None:
        given = [name for name, value in flags.items() if value is not None]
        if given:
            raise UsageError(f"describes a run without a workload file; {workload} already says what runs",
                             field=given[0])
        if show_workload:
            raise UsageError("shows the workload of a flag-only run (with --model)", field="--show-workload")
        path = _workload_path(workload)
        note_input(path)
        wl = load(path, engine=engine)
    elif model is None:
        raise UsageError("give a workload file, a bundled example's name (kvplan examples), or --model with "
                         "the flags of a serve run", field="workload")
    else:
        from kvplan.experiments import build_flags, flag_workload

        spec = flag_workload(model, "H100-80GB" if gpu is None else gpu, 1 if tp is None else tp, rate,
                             prompt or "1000", output or "200", 1000 if count is None else count,
                             timing_profile=_profile_path(timing_profile), engine=engine or "vllm")
        if show_workload:
            import json as json_module
            import sys

            from kvplan.workload.spec_yaml import spec_yaml

            (sys.stderr if json else sys.stdout).write(
                f"# kvplan simulate --model {json_module.dumps(spec.model)} --gpu {json_module.dumps(spec.gpu)}: "
                f"the workload it ran\n" + spec_yaml(spec))
        wl = build_flags(spec)
        workload = "the flags"
    for option, value, allowed in (("--csv", csv, ("serve", "fleet")), ("--rates", rates, ("serve",)),
                                   ("--cache-blocks", cache_blocks, ("prefix",)),
                                   ("--block-sizes", block_sizes, ("capacity", "serve")),
                                   ("--plot", plot, ("capacity", "serve", "prefix", "fleet"))):
        if value is not None and wl.experiment not in allowed:
            raise UsageError(f"applies to {' and '.join(allowed)} experiments, and {workload} is a "
                             f"{wl.experiment} experiment", field=option)
    if block_sizes is not None and wl.sglang is not None:
        raise UsageError("sweeps vLLM's block sizes; SGLang's pool has pages of one token", field="--block-sizes")
    if wl.experiment == "serve":
        from kvplan.cli.serve import simulate_serve

        simulate_serve(wl, json=json, plot=plot, csv=csv, rates=options["rates"],
                       latency_bound=latency_bound, block_sizes=options["block_sizes"])
    elif wl.experiment == "fleet":
        from kvplan.cli.fleet import simulate_fleet_run

        simulate_fleet_run(wl, json=json, plot=plot, csv=csv)
    else:
        _simulate_document(wl, json, plot, options)


def _workload_path(text: str) -> Path:
    """A workload file, or the bundled example of that name when no such file exists."""
    path = Path(text)
    if not path.exists():
        from kvplan.workload.examples import example_path

        bundled = example_path(text)
        if bundled is not None:
            return bundled
    return path


def _simulate_options(block_sizes, plot, csv, rates, latency_bound, cache_blocks) -> dict:
    """Check every option before any work, so a bad one costs nothing and writes nothing."""
    import math

    import importlib.util

    from kvplan.report.files import check_writable, distinct_outputs

    if plot is not None:
        check_writable(plot, "--plot")
        if plot.suffix.lower() not in (".png", ".svg"):
            raise UsageError(f"expected a .png or .svg file name, got {plot.name!r}", field="--plot")
        if importlib.util.find_spec("matplotlib") is None:  # a dependency; missing only in a broken install
            raise UsageError("needs matplotlib, a dependency of kvplan: pip install matplotlib", field="--plot")
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
    """Capacity, prefix and sharing experiments: one document, then a table or JSON, and a chart
    (serve and fleet runs have their own, kvplan/cli/serve.py and kvplan/cli/fleet.py)."""
    from kvplan.experiments import document
    from kvplan.report.files import atomic_write
    from kvplan.report.output import emit_json

    from kvplan.cli.progress import StderrBar

    # the bar of a long replay: on a terminal's stderr only, never with --json (kvplan/cli/progress.py)
    with StderrBar("simulating", 1, enabled=not as_json, delay_s=1.0) as bar:
        doc = document(wl, block_sizes=options["block_sizes"], cache_blocks=options["cache_blocks"],
                       progress=bar.report)
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
            if lo < 1 or hi < lo or lo & (lo - 1) or hi & (hi - 1):
                raise UsageError(f"a range runs over powers of two, so its ends must be powers of two "
                                 f"(such as 4-32), got {text!r}; for other sizes give a list like 3,8,40",
                                 field="--block-sizes")
            sizes = [1 << k for k in range(0, 31) if lo <= (1 << k) <= hi]
        else:
            sizes = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise bad from None
    if not sizes or any(s < 1 or s > 1 << 20 for s in sizes):
        raise bad
    return sorted(set(sizes))


def _profile_path(path: Path | None) -> str | None:
    """A --timing-profile, checked (one line on a bad file) and made absolute for the workload."""
    if path is None:
        return None
    from kvplan.model.timing_profile import profile_option

    return str(profile_option(path)[0])
