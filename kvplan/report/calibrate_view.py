"""`kvplan calibrate` as text: the constants before and after, and the errors per metric."""

from __future__ import annotations

from kvplan.report.output import console, print_table
from kvplan.text import count, terminal

METRICS = (("throughput", "output tokens/s"), ("ttft", "TTFT"), ("itl", "TPOT/ITL"), ("e2e", "E2E"))


def _pct(d: dict | None, key: str) -> str:
    return f"{d[key]:.1%}" if d and key in d else "-"


def render_calibration(doc: dict) -> None:
    from rich.table import Table

    out = console()
    table = Table(title=f"Step-time constants fitted on {count(len(doc['runs']), 'run')} of {terminal(doc['model'])} "
                        f"on {terminal(doc['gpu'])} (tp={doc['tp']})", title_justify="left")
    for name in ("constant", "shipped", "fitted", "range"):
        table.add_column(name, justify="left" if name == "constant" else "right")
    for name, value in doc["fitted"].items():
        low, high = doc["ranges"][name]
        table.add_row(terminal(name), f"{doc['shipped'][name]:.4g}", f"{value:.4g}", f"{low:.3g} - {high:.3g}")
    print_table(out, table)
    errors = Table(title="median |error| against the runs", title_justify="left")
    for name in ("metric", "shipped constants", "fitted", "each run left out"):
        errors.add_column(name, justify="left" if name == "metric" else "right")
    for key, label in METRICS:
        if key in doc["error_shipped"]:
            errors.add_row(label, _pct(doc["error_shipped"], key), _pct(doc["error_fitted"], key),
                           _pct(doc["error_leave_one_run_out"], key))
    print_table(out, errors)
    if doc["error_leave_one_run_out"] is None:
        out.print("leave-one-run-out needs two runs or more: the fitted column is in-sample")
    out.print(f"timing profile written to {terminal(doc['profile'])} "
              "(use: --timing-profile, or timing: {profile: ...})")
