"""`kvplan simulate` on a fleet workload: route and serve it (with a progress bar on long runs),
then write the per-request CSV and the chart, and report."""

from __future__ import annotations

from pathlib import Path

from kvplan.cli.progress import StderrBar
from kvplan.errors import KvplanError
from kvplan.report.files import write_outputs
from kvplan.report.output import emit_json
from kvplan.workload.records import Workload


def simulate_fleet_run(wl: Workload, *, json: bool, plot: Path | None, csv: Path | None) -> None:
    from kvplan.fleet.run import fleet_document, simulate_fleet
    from kvplan.report.fleet_view import plot_fleet, render_fleet, write_fleet_csv

    with StderrBar("simulating", 1, enabled=not json, delay_s=1.0) as bar:
        try:
            result = simulate_fleet(wl, progress=bar.report, record=csv is not None)
        except KvplanError as exc:  # at the line of the field, where it has one
            from kvplan.workload.schema import locate

            raise (locate(exc, wl.spec) if wl.spec is not None and wl.spec.path else exc.located(file=wl.path)) from None
    doc = fleet_document(wl, result=result)
    files = []
    if csv is not None:
        files.append((csv, lambda tmp: write_fleet_csv(result, tmp), "--csv"))
    if plot is not None:
        files.append((plot, lambda tmp: plot_fleet(doc, tmp), "--plot"))
    write_outputs(files)
    if json:
        emit_json(doc)
    else:
        render_fleet(doc)
