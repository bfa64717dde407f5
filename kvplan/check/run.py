"""`kvplan check`: CI regression checks on the numbers kvplan prints (schema: workloads/CHECKS.md).

A check file lists named checks. Each runs `size` or `simulate` and gets the very dict their
`--json` prints; a simulate check may `select` one entry of the document's `results`. Assertions
are thresholds (``max_concurrency >= 40``) and comparisons with a stored baseline within a
tolerance. An assertion is parsed by one regular expression and compared with `operator`; no text
from a check file is ever evaluated. A bad check file, workload or baseline is a KvplanError
(exit 2); a failed assertion is an outcome (exit 1 in the CLI).

This module runs checks and is the package's front door; the parts live beside it, each importing
only those before it: check_records (the records) <- check_expr (assertions) <- check_file (the
check file), check_baseline (the baseline file), check_lookup (a metric in a document) <- here.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvplan.check.baseline import MAX_BASELINE_BYTES, compare, load_baseline
from kvplan.check.expr import OPS, threshold
from kvplan.check.file import FAIL_ON, SIZE_KEYS, load_checks
from kvplan.check.lookup import lookup, metric_path, select_entry
from kvplan.check.records import (
    BASELINE_FORMAT,
    Check,
    CheckReport,
    CheckResult,
    Expect,
    Outcome,
    Tracked,
    is_number,
    kind_of,
)
from kvplan.errors import KvplanError


def run_checks(checks: list[Check], baseline: str | Path | dict | None = None) -> CheckReport:
    """Run every check; compare tracked metrics with `baseline` (a file or its loaded dict) if given."""
    stored = load_baseline(baseline) if isinstance(baseline, (str, Path)) else baseline
    cache: dict = {}
    results = tuple(_run_one(c, stored, cache) for c in checks)
    where = str(baseline) if isinstance(baseline, (str, Path)) else ("<dict>" if baseline is not None else None)
    return CheckReport(checks[0].file if checks else "", where, results)


def _run_one(check: Check, stored: dict | None, cache: dict) -> CheckResult:
    doc = _document(check, cache)
    target = select_entry(check, doc)
    outcomes = [threshold(check, e, lookup(check, target, doc, e.metric, e.key_path, e.line))
                for e in check.expects]
    tracked = {}
    for t in check.tracked:
        value = lookup(check, target, doc, t.metric, t.key_path, t.line)
        if value is not None and not is_number(value):
            raise check.error(f"{t.metric} is {kind_of(value)}; a baseline compares numbers", t.key_path, t.line)
        tracked[t.metric] = value
        if stored is not None:
            outcomes.append(compare(t, value, stored.get(check.name, {})))
    return CheckResult(check.name, check.kind, tuple(outcomes), tracked)


def _document(check: Check, cache: dict) -> dict:
    """The JSON document the check's command prints (as `--json` would print it), cached per run."""
    from kvplan.report.output import dumps

    key = (check.kind, json.dumps(check.options, sort_keys=True))
    if key not in cache:
        try:
            raw = _size_doc(check.options) if check.kind == "size" else _simulate_doc(
                Path(check.options["workload"]), check.options)
        except KvplanError as e:
            raise _locate(check, e)
        cache[key] = json.loads(dumps(raw))
    return cache[key]


def _locate(check: Check, e: KvplanError) -> KvplanError:
    """An error without a file (a bad option, an unknown GPU or model) points at the check's key."""
    if e.file is not None:
        return e
    key = (e.field or "").lstrip("-").replace("-", "_")
    line = check.option_lines.get(key)
    if line is None:
        key = "model" if check.kind == "size" else "workload"
        line = check.option_lines.get(key, check.line)
    return check.error(e.message, f"{check.key_path}.{check.kind}.{key}", line)


def _size_doc(opts: dict) -> dict:
    from kvplan.model.size import size

    return size(**opts).to_dict()


def _simulate_doc(path: Path, opts: dict) -> dict:
    """What `kvplan simulate PATH --json` prints (`--block-sizes` as `block_sizes`)."""
    from kvplan.experiments import document, load

    return document(load(path), block_sizes=opts.get("block_sizes"))


__all__ = ["BASELINE_FORMAT", "FAIL_ON", "MAX_BASELINE_BYTES", "OPS", "SIZE_KEYS", "Check", "CheckReport",
           "CheckResult", "Expect", "Outcome", "Tracked", "load_baseline", "load_checks", "metric_path",
           "run_checks"]  # fmt: skip
