"""`kvplan simulate` on a serve workload: run the engine per allocator (with a progress bar on long
runs), the rate sweep if asked, then write the CSV and chart and report."""

from __future__ import annotations

from pathlib import Path

from kvplan.cli.progress import StderrBar
from kvplan.errors import KvplanError
from kvplan.experiments import with_block_sizes
from kvplan.report.files import write_outputs
from kvplan.report.output import emit_json
from kvplan.report.serve_view import plot_serve, render_serve, write_requests_csv
from kvplan.workload.records import Workload


def simulate_serve(wl: Workload, *, json: bool, plot: Path | None, csv: Path | None,
                   rates: list[float] | None, latency_bound: float, block_sizes: list[int] | None) -> None:
    wl = with_block_sizes(wl, block_sizes)
    try:
        results, doc = _run(wl, csv is not None, rates, latency_bound, show_progress=not json)
    except KvplanError as exc:  # settings that can never serve a request: say which file
        raise exc.located(file=wl.path) from None
    files = []
    if csv is not None:
        files.append((csv, lambda tmp: write_requests_csv(results, tmp), "--csv"))
    if plot is not None:
        files.append((plot, lambda tmp: plot_serve(results, tmp, wl.name), "--plot"))
    write_outputs(files)
    if json:
        emit_json(doc)
    else:
        render_serve(doc)


def _run(wl: Workload, record: bool, rates, latency_bound: float, show_progress: bool):
    from kvplan.sim.engine import document_of, simulate_all

    with _Progress(wl.num_requests, len(wl.allocators), enabled=show_progress) as bar:
        results = simulate_all(wl, progress_for=bar.callback, record_requests=record)
        doc = document_of(wl, results)
        if rates:  # the sweep's runs follow those run (a cached run may have added its no-cache twin)
            bar.set_total(wl.num_requests * (len(results) + len(wl.allocators) * len(rates)))
            doc["rate_sweep"] = _sweep(wl, rates, latency_bound, bar, len(results))
    return results, doc


def _sweep(wl: Workload, rates: list[float], latency_bound: float, bar: "_Progress", first: int) -> list[dict]:
    from kvplan.sim.inputs import make_setup
    from kvplan.sim.sweep import rate_sweep

    return [{"label": make_setup(wl, spec).label if wl.sglang is not None else spec.label,
             **rate_sweep(wl, spec, rates, latency_bound,
                          progress_for=lambda i, a=a: bar.callback(first + a * len(rates) + i)).to_dict()}
            for a, spec in enumerate(wl.allocators)]


class _Progress(StderrBar):
    """The bar over every allocator's run, shown once the runs have taken more than a second."""

    def __init__(self, per_run: int, runs: int, enabled: bool) -> None:
        super().__init__("simulating", per_run * runs, enabled=enabled, delay_s=1.0)
        self.per_run = per_run

    def callback(self, index: int):
        """The engine's progress(completed, loaded) hook for the index-th allocator's run."""
        return lambda completed, loaded: self.update(index * self.per_run + completed)
