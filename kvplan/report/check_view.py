"""`kvplan check` as a rich table (one row per assertion) and as Markdown for a CI job summary."""

from __future__ import annotations

import html
import json
from typing import Any

from kvplan.text import count, terminal


def _value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return json.dumps(v)
    if isinstance(v, float):
        return f"{v:.12g}"
    return str(v)


def _bound(o) -> str:
    """The threshold as written, or the baseline value with its tolerance."""
    if o.kind == "expect":
        return f"{o.op} {_value(o.bound)}"
    if o.bound is None:
        return "(no baseline)"
    sign = {"~": "±", ">~": "-", "<~": "+"}.get(o.op, "±")
    return f"baseline {_value(o.bound)} {sign}{_value(o.tolerance)}"


def _assertion(o) -> str:
    return o.text if o.kind == "expect" else f"{o.metric} vs baseline"


def summary(report) -> str:
    """One sentence: how many assertions passed or failed, and in which checks."""
    outcomes = report.outcomes
    failed = [(name, o) for name, o in outcomes if not o.passed]
    checks = count(len(report.results), "check")
    if not failed:
        return f"All {count(len(outcomes), 'assertion')} of {checks} passed."
    names = list(dict.fromkeys(name for name, _ in failed))
    total = count(len(outcomes), "assertion")
    return f"{len(failed)} of {total} failed, in {len(names)} of {checks}: {', '.join(names)}."


def skipped_note(report, tracked: int) -> str | None:
    if report.baseline is None and tracked:
        return f"{tracked} baseline metrics not compared: give --baseline FILE."
    return None


def render_check(report, *, wrote_baseline: str | None = None) -> None:
    """One row per assertion (metric, value, bound, pass/FAIL) under its check's name, then the summary."""
    from rich import box
    from rich.table import Table

    from kvplan.report.output import console

    table = Table(title=f"kvplan check {terminal(report.file)}", title_justify="left", box=box.SIMPLE_HEAD)
    for col, justify in (("check / metric", "left"), ("value", "right"), ("bound", "left"), ("result", "left")):
        table.add_column(col, justify=justify, overflow="fold", min_width=24 if col == "check / metric" else None)
    for result in report.results:
        table.add_row(terminal(result.name), style="bold")
        for o in result.outcomes:
            table.add_row(f"  {terminal(o.metric)}", terminal(_value(o.value)), terminal(_bound(o)),
                          "pass" if o.passed else "FAIL",
                          style=None if o.passed else "bold red")  # fmt: skip
    out = console()
    out.print(table)
    for line in _notes(report, wrote_baseline):
        out.print(terminal(line))


def _notes(report, wrote_baseline: str | None) -> list[str]:
    tracked = sum(len(r.tracked) for r in report.results)
    lines = [f"FAIL {name}: {_assertion(o)}: {o.detail}" for name, o in report.outcomes if not o.passed and o.detail]
    lines.append(summary(report))
    note = skipped_note(report, tracked) if wrote_baseline is None else None
    if note:
        lines.append(note)
    if wrote_baseline is not None:
        lines.append(f"Wrote {tracked} baseline metrics to {wrote_baseline}.")
    return lines


def _cell(text: str) -> str:
    """Markdown table cell: HTML-escaped, pipes escaped, on one line."""
    return html.escape(" ".join(str(text).split()), quote=False).replace("|", "\\|")


def render_markdown(report, *, wrote_baseline: str | None = None) -> str:
    """A GitHub-flavoured Markdown summary (for $GITHUB_STEP_SUMMARY)."""
    mark = "✅" if report.passed else "❌"
    lines = [f"## {mark} kvplan check <code>{_cell(report.file)}</code>", "",
             _cell(" ".join(_notes(report, wrote_baseline))), "",
             "| | check | assertion | value | bound |", "|---|---|---|---|---|"]
    for name, o in report.outcomes:
        lines.append(f"| {'✅' if o.passed else '❌'} | {_cell(name)} | <code>{_cell(_assertion(o))}</code> | "
                     f"{_cell(_value(o.value))} | {_cell(_bound(o))} |")  # fmt: skip
    return "\n".join(lines) + "\n"
