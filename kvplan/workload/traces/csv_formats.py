"""CSV traces (Azure LLM inference, Vidur): parsed once into numpy arrays."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import numpy as np

from kvplan.errors import TraceError
from kvplan.workload.traces._rows import _int_or_none, _Rows


def _read_csv(path: Path, columns: tuple[str, ...]) -> tuple[list[list[str]], np.ndarray]:
    """The named columns as lists of text, and each row's line number."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in columns if c not in header]
        if missing:
            raise TraceError(f"missing column(s) {', '.join(missing)}; header has "
                             f"{', '.join(header) or 'nothing'}", file=path, line=1,
                             field=missing[0])  # fmt: skip
        index = [header.index(c) for c in columns]
        need = max(index) + 1
        cols: list[list[str]] = [[] for _ in columns]
        lines: list[int] = []
        for row in reader:
            if not row:
                continue
            if len(row) < need:
                raise TraceError(f"row has {len(row)} fields, expected {len(header)}",
                                 file=path, line=reader.line_num)  # fmt: skip
            for col, i in zip(cols, index):
                col.append(row[i])
            lines.append(reader.line_num)
    if not lines:
        raise TraceError("the trace has no rows", file=path)
    return cols, np.asarray(lines, dtype=np.int64)


def _int_column(values: list[str], lines, path, name, lo: int) -> np.ndarray:
    try:
        out = np.asarray(values).astype(np.int64)
    except ValueError:
        out = np.empty(len(values), dtype=np.int64)
        for i, v in enumerate(values):
            n = _int_or_none(v.strip())
            if n is None:
                raise TraceError(f"expected an integer, got {v!r}", file=path,
                                 line=int(lines[i]), field=name) from None  # fmt: skip
            out[i] = n
    bad = np.flatnonzero(out < lo)
    if bad.size:
        i = bad[0]
        raise TraceError(f"expected an integer >= {lo}, got {out[i]}", file=path,
                         line=int(lines[i]), field=name)  # fmt: skip
    return out


def _check_sorted(t: np.ndarray, where, name: str) -> None:
    bad = np.flatnonzero(np.diff(t) < 0)
    if bad.size:
        raise TraceError("timestamps go backwards (rows must be in arrival order)",
                         field=name, **where(int(bad[0]) + 1))  # fmt: skip


def _read_azure(path: Path) -> _Rows:
    (ts, ctx, gen), lines = _read_csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
    where = lambda i: {"file": path, "line": int(lines[i])}  # noqa: E731
    with warnings.catch_warnings():  # numpy warns about (and applies) time-zone offsets
        warnings.simplefilter("ignore")
        try:
            stamps = np.asarray(ts, dtype="datetime64[ns]")
        except ValueError:
            for i, v in enumerate(ts):
                try:
                    np.datetime64(v, "ns")
                except ValueError:
                    raise TraceError(f"expected a date-time like 2023-11-16 18:17:03.97, got {v!r}",
                                     field="TIMESTAMP", **where(i)) from None  # fmt: skip
            raise
    if np.isnat(stamps).any():
        first = int(np.isnat(stamps).argmax())
        raise TraceError("empty timestamp", field="TIMESTAMP", **where(first))
    arrival = (stamps - stamps[0]).astype(np.int64) / 1e9
    _check_sorted(arrival, where, "TIMESTAMP")
    return _Rows(arrival, _int_column(ctx, lines, path, "ContextTokens", 1),
                 _int_column(gen, lines, path, "GeneratedTokens", 0), where)  # fmt: skip


def _read_vidur(path: Path) -> _Rows:
    cols = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
    (at, pre, dec), lines = _read_csv(path, cols)
    where = lambda i: {"file": path, "line": int(lines[i])}  # noqa: E731
    arrival = np.empty(len(at))
    for i, v in enumerate(at):
        try:
            arrival[i] = float(v)
        except ValueError:
            arrival[i] = np.nan
        if not np.isfinite(arrival[i]) or arrival[i] < 0:
            raise TraceError(f"expected a number of seconds >= 0, got {v!r}",
                             field="arrived_at", **where(i))  # fmt: skip
    _check_sorted(arrival, where, "arrived_at")
    return _Rows(arrival - arrival[0], _int_column(pre, lines, path, cols[1], 1),
                 _int_column(dec, lines, path, cols[2], 0), where)  # fmt: skip
