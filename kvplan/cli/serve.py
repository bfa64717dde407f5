"""`kvplan simulate` on a serve workload: run the engine per allocator (with a progress bar on long
runs), the rate sweep if asked, then write the CSV and chart and report."""

from __future__ import annotations

import sys
import time
from pathlib import Path

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

    interactive = sys.stderr.isatty()  # on a pipe or in a log a bar is noise, and an error must be one line
    with _Progress(wl.num_requests, len(wl.allocators), enabled=show_progress and interactive) as bar:
        results = simulate_all(wl, progress_for=bar.callback, record_requests=record)
        doc = document_of(wl, results)
        if rates:
            doc["rate_sweep"] = _sweep(wl, rates, latency_bound)
    return results, doc


def _sweep(wl: Workload, rates: list[float], latency_bound: float) -> list[dict]:
    from kvplan.sim.sweep import rate_sweep

    return [{"label": spec.label, **rate_sweep(wl, spec, rates, latency_bound).to_dict()}
            for spec in wl.allocators]


class _Progress:
    """A rich progress bar on stderr, shown only on a terminal and once a run has taken more than
    a second."""

    def __init__(self, per_run: int, runs: int, enabled: bool) -> None:
        self.per_run, self.total, self.enabled = per_run, max(per_run * runs, 1), enabled
        self.start = time.monotonic()
        self.bar = self.task = None

    def __enter__(self) -> "_Progress":
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()

    def callback(self, index: int):
        """The engine's progress(completed, loaded) hook for the index-th allocator's run."""

        def report(completed: int, loaded: int) -> None:
            if not self.enabled or time.monotonic() - self.start < 1.0:
                return
            if self.bar is None:
                from rich.console import Console
                from rich.progress import Progress

                self.bar = Progress(console=Console(stderr=True), transient=True)
                self.task = self.bar.add_task("simulating", total=self.total)
                self.bar.start()
            self.bar.update(self.task, completed=min(index * self.per_run + completed, self.total))

        return report
