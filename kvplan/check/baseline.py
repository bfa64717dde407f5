"""The baseline file of `kvplan check`: read it, and compare a tracked metric with it.

`--update-baseline` writes `CheckReport.baseline_document()`; `load_baseline` reads it back,
refusing anything but {check name: {metric: number or null}} with one clear error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvplan.check.records import BASELINE_FORMAT, Outcome, Tracked, is_number
from kvplan.errors import KvplanError, WorkloadError
from kvplan.fileio import load_json, read_limited

MAX_BASELINE_BYTES = 10 * 1024 * 1024


def load_baseline(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read a baseline JSON written by `--update-baseline`: {check name: {metric: number}}."""
    path = Path(path)

    def fail(message: str, field: str | None = None, line: int | None = None) -> KvplanError:
        return WorkloadError(message, file=path, field=field, line=line)

    data = read_limited(path, MAX_BASELINE_BYTES, WorkloadError)
    doc = load_json(data, path, WorkloadError, object_pairs_hook=_no_duplicates,
                    parse_constant=_no_constant, parse_float=_finite, parse_int=_finite_int)
    if not isinstance(doc, dict) or doc.get("kvplan_check_baseline") != BASELINE_FORMAT:
        raise fail(f"expected an object with \"kvplan_check_baseline\": {BASELINE_FORMAT} (written by "
                   "kvplan check --update-baseline)", field="kvplan_check_baseline")  # fmt: skip
    checks = doc.get("checks")
    if not isinstance(checks, dict):
        raise fail("expected an object of checks", field="checks")
    for name, metrics in checks.items():
        if not isinstance(metrics, dict):
            raise fail("expected an object of metric values", field=f"checks.{name}")
        for metric, value in metrics.items():
            if value is not None and not is_number(value):
                raise fail(f"expected a number or null, got {json.dumps(value)}", field=f"checks.{name}.{metric}")
    return checks


def _no_duplicates(pairs: list) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(text: str):
    raise ValueError(f"{text} is not a number JSON allows")


def _finite(text: str) -> float:
    """A JSON number as a float; one too large for a float (1e999) is refused, not infinity."""
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is too large for a number")
    return value


def _finite_int(text: str) -> int:
    """A JSON integer that a comparison can hold as a float (10**400 is refused, not an OverflowError)."""
    value = int(text)
    try:
        float(value)
    except OverflowError:
        raise ValueError(f"a {len(text.lstrip('-')):,}-digit integer is too large for a number") from None
    return value


def compare(t: Tracked, value: Any, stored: dict) -> Outcome:
    text = f"{t.metric} vs baseline"
    base = stored.get(t.metric, _MISSING)
    op = {"change": "~", "drop": ">~", "rise": "<~"}[t.fail_on]
    if base is _MISSING or base is None:
        return Outcome("baseline", t.metric, op, None, value, False, text,
                       "not in the baseline; run kvplan check --update-baseline")  # fmt: skip
    allowed = max(t.abs_tol, t.rel_tol * abs(base))
    if value is None:
        return Outcome("baseline", t.metric, op, base, None, False, text, "no value (null)", allowed)
    low_ok, high_ok = value >= base - allowed, value <= base + allowed
    passed = {"change": low_ok and high_ok, "drop": low_ok, "rise": high_ok}[t.fail_on]
    moved = f"{'fell' if value < base else 'rose'} by {abs(value - base):.6g}"
    detail = "" if passed else f"{moved} (allowed {allowed:.6g})"
    return Outcome("baseline", t.metric, op, base, value, passed, text, detail, allowed)


_MISSING = object()
