"""`kvplan check FILE`: run a check file's assertions; exit 0 when all pass, 1 when any fails.

Bad input (the check file, a workload it names, the baseline, an option) raises KvplanError,
which kvplan.cli.main turns into one line and exit code 2. Output files (--markdown, --update-baseline) are checked before any work and
written atomically after it, so a run that fails on bad input leaves nothing behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kvplan.errors import UsageError


def check(
    file: Annotated[Path, typer.Argument(help="Check file (YAML; see workloads/CHECKS.md).")],
    json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
    baseline: Annotated[Optional[Path], typer.Option(help="Baseline JSON to compare tracked metrics with.")] = None,
    update_baseline: Annotated[bool, typer.Option("--update-baseline", help="Write this run's tracked metrics to --baseline instead of comparing.")] = False,
    markdown: Annotated[Optional[Path], typer.Option(help="Also write a Markdown summary (e.g. $GITHUB_STEP_SUMMARY).")] = None,
) -> None:
    """Run CI regression checks: thresholds and baseline comparisons on size/simulate results.

    Example: kvplan check workloads/checks.yaml --baseline workloads/checks-baseline.json
    """
    from kvplan.check.run import load_checks, run_checks
    from kvplan.fileio import note_input
    from kvplan.report.files import check_writable, distinct_outputs, write_outputs

    if update_baseline and baseline is None:
        raise UsageError("needs --baseline FILE to write to", field="--update-baseline")
    note_input(file)
    if baseline is not None and not update_baseline:
        note_input(baseline)
    outputs = {"--baseline": baseline if update_baseline else None, "--markdown": markdown}
    for field, path in outputs.items():
        if path is not None:
            check_writable(path, field)
    distinct_outputs(outputs)
    checks = load_checks(file)
    report = run_checks(checks, None if update_baseline else baseline)
    wrote = str(baseline) if update_baseline else None
    files = []
    if update_baseline:
        from kvplan.report.output import dumps

        text = dumps(report.baseline_document())
        files.append((baseline, lambda tmp: tmp.write_text(text, encoding="utf-8"), "--baseline"))
    if markdown is not None:
        from kvplan.report.check_view import render_markdown

        summary = render_markdown(report, wrote_baseline=wrote)
        files.append((markdown, lambda tmp: tmp.write_text(summary, encoding="utf-8"), "--markdown"))
    write_outputs(files)
    _show(report, json, wrote)
    if not report.passed:
        raise SystemExit(1)


def _show(report, as_json: bool, wrote: str | None) -> None:
    if as_json:
        from kvplan.report.output import emit_json

        emit_json({**report.to_dict(), "baseline_written": wrote})
    else:
        from kvplan.report.check_view import render_check

        render_check(report, wrote_baseline=wrote)


__all__ = ["check"]
