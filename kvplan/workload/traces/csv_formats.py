"""CSV traces (Azure LLM inference, Vidur, and any CSV with a column mapping), streamed in blocks
of rows that numpy parses at once.

`csv_blocks(fmt, path)` reads the file line by line through kvplan/fileio.py (UTF-8 or gzip,
bounded lines, a byte-order mark dropped) and yields validated `_Rows` of at most `block_rows`
rows: memory depends on the block size, never on the length of the trace.

A format may have several layouts (LAYOUTS), told apart by the header: Vidur's trace_replay
generator reads `arrived_at,num_prefill_tokens,num_decode_tokens` since Vidur's commit a28d390
(2024-08, the Splitwise traces in its data/processed_traces/), and `Date,Time,PromptTokenCount,
CompletionTokenCount` before it and in the vidur 0.0.26 wheel on PyPI, where it keeps only the
rows of one `Date` (its `date` option) and takes `Time` (seconds) as the arrival. The generic
`csv` format reads the three columns a `TraceColumns` names (kvplan/workload/traces/columns.py),
its times in seconds, milliseconds, microseconds or as date-times.
"""

from __future__ import annotations

import csv
import warnings
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from kvplan.errors import TraceError
from kvplan.fileio import MAX_LINE_BYTES, text_lines
from kvplan.workload.chunks import CHUNK_SIZE, MAX_TOKENS
from kvplan.workload.traces._rows import _int_or_none, _Rows
from kvplan.workload.traces.columns import TIMESTAMP_UNITS, TraceColumns

# One field may be as long as one line may be (kvplan/fileio.py bounds the line).
csv.field_size_limit(max(csv.field_size_limit(), MAX_LINE_BYTES))

# Per format, its layouts: (time, prompt tokens, output tokens[, Date]) column names. The first
# layout whose columns the header has all of is read; a header with none is reported against the
# layout it is closest to (fewest columns missing).
LAYOUTS = {
    "azure": (("TIMESTAMP", "ContextTokens", "GeneratedTokens"),),
    "vidur": (("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
              ("Time", "PromptTokenCount", "CompletionTokenCount", "Date")),
}  # fmt: skip


def _pick_layout(header: list[str], layouts: tuple[tuple[str, ...], ...], path: Path,
                 hint: str = "") -> tuple[str, ...]:
    for columns in layouts:
        if all(c in header for c in columns):
            return columns
    shown = [c[3:] + c[:3] for c in layouts]  # as the files have them: Date first
    missing = min(([c for c in cols if c not in header] for cols in shown), key=len)
    also = f" (layouts: {'; '.join(','.join(c) for c in shown)})" if len(layouts) > 1 else ""
    shown_header = ", ".join(h[:60] for h in header[:20]) + (", ..." if len(header) > 20 else "")
    raise TraceError(f"missing column(s) {', '.join(missing)}{also}; header has "
                     f"{shown_header or 'nothing'}{hint}", file=path, line=1, field=missing[0])


def _raw_blocks(path: Path, layouts: tuple[tuple[str, ...], ...], block_rows: int,
                picked: list | None = None, hint: str = "") -> Iterator[tuple[list[list[str]], np.ndarray]]:
    """The columns of the layout the header matches as lists of text, with each row's line
    number, `block_rows` at a time; the layout's names are appended to `picked`."""
    reader = csv.reader(text_lines(path, TraceError))
    try:
        header = [h.strip() for h in next(reader, [])]
        columns = _pick_layout(header, layouts, path, hint)
        if picked is not None:
            picked.append(columns)
        index = [header.index(c) for c in columns]
        need = max(index) + 1
        cols: list[list[str]] = [[] for _ in columns]
        lines: list[int] = []
        seen = 0
        for row in reader:
            if not row:
                continue
            if len(row) < need:
                raise TraceError(f"row has {len(row)} fields, expected {len(header)}",
                                 file=path, line=reader.line_num)  # fmt: skip
            for col, i in zip(cols, index):
                col.append(row[i])
            lines.append(reader.line_num)
            if len(lines) == block_rows:
                seen += len(lines)
                yield cols, np.asarray(lines, dtype=np.int64)
                cols, lines = [[] for _ in columns], []
    except csv.Error as exc:
        raise TraceError(f"not valid CSV: {exc}", file=path, line=reader.line_num) from None
    if lines:
        yield cols, np.asarray(lines, dtype=np.int64)
    elif not seen:
        raise TraceError("the trace has no rows", file=path)


def _int_column(values: list[str], lines, path, name, lo: int) -> np.ndarray:
    out = np.empty(len(values), dtype=np.int64)
    try:
        out[:] = np.asarray(values).astype(np.int64)
    except (ValueError, OverflowError):
        for i, v in enumerate(values):
            n = _int_or_none(v.strip()[:40])
            if n is None or not lo <= n <= MAX_TOKENS:
                raise TraceError(f"expected an integer >= {lo} and at most {MAX_TOKENS:,}, "
                                 f"got {v[:40]!r}", file=path, line=int(lines[i]), field=name) from None
            out[i] = n
    bad = np.flatnonzero((out < lo) | (out > MAX_TOKENS))
    if bad.size:
        i = bad[0]
        raise TraceError(f"expected an integer >= {lo} and at most {MAX_TOKENS:,}, got {out[i]}",
                         file=path, line=int(lines[i]), field=name)  # fmt: skip
    return out


class _Clock:
    """Arrival seconds relative to the first row, checked to never go backwards across blocks."""

    def __init__(self, path: Path, name: str):
        self.path, self.name = path, name
        self.first: float | np.datetime64 | None = None
        self.last = -np.inf

    def relative(self, t: np.ndarray, lines: np.ndarray) -> np.ndarray:
        if self.first is None:
            self.first = t[0]
        out = t - self.first
        seconds = out.astype(np.int64) / 1e9 if out.dtype.kind == "m" else out.astype(np.float64)
        steps = np.diff(np.concatenate(([self.last], seconds)))
        bad = np.flatnonzero(steps < 0)
        if bad.size:
            raise TraceError("timestamps go backwards (rows must be in arrival order)",
                             file=self.path, line=int(lines[bad[0]]), field=self.name)  # fmt: skip
        self.last = seconds[-1]
        return seconds


def _date_times(ts: list[str], lines: np.ndarray, path: Path, name: str = "TIMESTAMP",
                hint: str = "") -> np.ndarray:
    """ISO date-times (`2023-11-16 18:17:03.97`) as datetime64[ns]; `hint` follows a refusal."""
    with warnings.catch_warnings():  # numpy warns about (and applies) time-zone offsets
        warnings.simplefilter("ignore")
        try:
            stamps = np.asarray(ts, dtype="datetime64[ns]")
        except (ValueError, OverflowError):
            for i, v in enumerate(ts):
                try:
                    np.datetime64(v, "ns")
                except (ValueError, OverflowError):
                    more = hint if _number(v) is not None else ""
                    raise TraceError(f"expected a date-time like 2023-11-16 18:17:03.97, got {v[:40]!r}{more}",
                                     file=path, line=int(lines[i]), field=name) from None
            raise
    if np.isnat(stamps).any():
        first = int(np.isnat(stamps).argmax())
        raise TraceError("empty timestamp", file=path, line=int(lines[first]), field=name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seconds = np.asarray(ts, dtype="datetime64[s]")  # numpy wraps ns stamps past 2262 silently
    wrapped = np.flatnonzero(stamps.astype("datetime64[s]") != seconds)
    if wrapped.size:
        i = int(wrapped[0])
        more = hint if _number(ts[i]) is not None else ""
        raise TraceError(f"expected a date-time between 1678 and 2261, got {ts[i][:40]!r}{more}", file=path,
                         line=int(lines[i]), field=name)
    return stamps


_AZURE_HINT = ("; a number: for timestamps in seconds or milliseconds use format: csv with columns "
               "and timestamp_unit (workloads/SCHEMA.md)")


def _azure_times(ts: list[str], lines: np.ndarray, path: Path) -> np.ndarray:
    return _date_times(ts, lines, path, "TIMESTAMP", _AZURE_HINT)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _numeric_times(at: list[str], lines: np.ndarray, path: Path, name: str, unit: str = "s") -> np.ndarray:
    """Numbers >= 0 in `unit` (not scaled: epoch microseconds lose precision as seconds before the
    first row is subtracted); a date-time in the column says which unit reads it."""
    try:
        arrival = np.fromiter(map(float, at), np.float64, len(at))  # 3x numpy's text-to-float cast
    except ValueError:
        arrival = np.array([np.nan if (x := _number(v)) is None else x for v in at], dtype=np.float64)
    bad = np.flatnonzero(~(np.isfinite(arrival) & (arrival >= 0)))
    if bad.size:
        i, v = int(bad[0]), at[int(bad[0])]
        words = {"s": "seconds", "ms": "milliseconds", "us": "microseconds"}[unit]
        dated = _number(v) is None and any(c in v for c in "-:T")
        more = "; date-times are read with timestamp_unit: datetime" if dated else ""
        raise TraceError(f"expected a number of {words} >= 0, got {v[:40]!r}{more}",
                         file=path, line=int(lines[i]), field=name)  # fmt: skip
    return arrival


def _vidur_times(at: list[str], lines: np.ndarray, path: Path, name: str = "arrived_at") -> np.ndarray:
    return _numeric_times(at, lines, path, name)


_TIMES: dict[str, Callable[..., np.ndarray]] = {"azure": _azure_times, "vidur": _vidur_times}


class _OneDate:
    """Vidur's Date,Time layout: every row must carry the first row's Date (Vidur replays one)."""

    def __init__(self, path: Path):
        self.path, self.date = path, None

    def check(self, dates: list[str], lines: np.ndarray) -> None:
        if self.date is None:
            self.date = dates[0].strip()
        for i, d in enumerate(dates):
            if d.strip() != self.date:
                raise TraceError(f"Date {d.strip()[:40]!r} differs from {self.date[:40]!r} on the "
                                 "first row; Vidur replays the rows of one date (its `date` option): "
                                 "keep one date's rows", file=self.path, line=int(lines[i]),
                                 field="Date")  # fmt: skip


def _csv_times(columns: TraceColumns):
    if columns.unit == "datetime":
        hint = "; numbers are read with timestamp_unit: s, ms or us"
        return lambda ts, lines, path, name: _date_times(ts, lines, path, name, hint)
    return lambda ts, lines, path, name: _numeric_times(ts, lines, path, name, columns.unit)


def csv_blocks(fmt: str, path: Path, block_rows: int = CHUNK_SIZE,
               columns: TraceColumns | None = None) -> Iterator[_Rows]:
    """Validated rows of an Azure, Vidur or generic (`csv`, read by `columns`) CSV trace,
    `block_rows` at a time, streamed."""
    picked: list[tuple[str, ...]] = []
    clock = dates = None
    if fmt == "csv":
        columns = columns or TraceColumns()
        layouts, times = (columns.layout(),), _csv_times(columns)
        scale = TIMESTAMP_UNITS[columns.unit] or 1.0  # after the first row is subtracted
        hint = "; name the columns with trace.columns: {timestamp: ..., prompt_tokens: ..., output_tokens: ...}"
    else:
        layouts, times, hint, scale = LAYOUTS[fmt], _TIMES[fmt], "", 1.0
    for cols, lines in _raw_blocks(path, layouts, block_rows, picked, hint):
        names = picked[0]
        if clock is None:
            clock = _Clock(path, names[0])
            dates = _OneDate(path) if len(names) > 3 else None
        if dates is not None:
            dates.check(cols[3], lines)
        t = times(cols[0], lines, path, *((names[0],) if fmt != "azure" else ()))
        arrival = clock.relative(t, lines)
        if scale != 1.0:
            arrival = arrival * scale
        yield _Rows(arrival, _int_column(cols[1], lines, path, names[1], 1),
                    _int_column(cols[2], lines, path, names[2], 0),
                    lambda i, lines=lines: {"file": path, "line": int(lines[i])})  # fmt: skip
