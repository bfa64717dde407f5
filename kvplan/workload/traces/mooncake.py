"""Mooncake JSONL traces, streamed line by line (one hash id per 512-token prompt block)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import numpy as np

from kvplan.errors import TraceError
from kvplan.fileio import load_json, text_lines
from kvplan.workload.traces._rows import MOONCAKE_BLOCK, _field_int
from kvplan.workload.chunks import RequestChunk


def _mooncake_records(path: Path) -> Iterator[tuple[int, float, int, int, list]]:
    """(line, timestamp ms, input, output, hash_ids) per non-blank line, validated."""
    prev = -np.inf
    for line, text in enumerate(text_lines(path, TraceError), 1):
        if not text.strip():
            continue
        fail = lambda k, m, n=line: TraceError(m, file=path, line=n, field=k)  # noqa: E731
        d = load_json(text, path, TraceError, line=line)
        if not isinstance(d, dict):
            raise fail(None, "expected a JSON object")
        raw = d.get("timestamp")
        ts = _milliseconds(raw)
        if ts is None:
            raise fail("timestamp", f"expected milliseconds >= 0, got {json.dumps(raw)[:40]}")
        if ts < prev:
            raise fail("timestamp", f"goes backwards ({ts} after {prev})")
        prev = ts
        n_in = _field_int(d, "input_length", 1, fail)
        n_out = _field_int(d, "output_length", 0, fail)
        ids = d.get("hash_ids")
        want = -(-n_in // MOONCAKE_BLOCK)
        if not isinstance(ids, list) or len(ids) != want:
            got = len(ids) if isinstance(ids, list) else json.dumps(ids)
            raise fail("hash_ids", f"expected ceil(input_length / 512) = {want} ids, got {got}")
        if not all(type(h) is int and h >= 0 for h in ids):
            raise fail("hash_ids", "expected integers >= 0")
        yield line, ts, n_in, n_out, ids


def _mooncake_scan(path: Path, stop_after: int | None) -> tuple[int, float, float]:
    """Count the records and read the first and last timestamps (ms) without parsing the rest."""
    count, first, last = 0, None, None
    for text in text_lines(path, TraceError):
        if text.strip():
            count += 1
            last = text
            if first is None:
                first = text
            if stop_after is not None and count >= stop_after:
                break
    if not count:
        raise TraceError("the trace has no records", file=path)
    t0, t1 = _stamp(first), _stamp(last)
    ok = t0 is not None and t1 is not None
    return count, (t0 if ok else 0.0), (t1 if ok else 0.0)  # bad rows are reported when read


def _milliseconds(value) -> float | None:
    """A timestamp as a finite float >= 0, or None (a bool, a string, 10**400 and inf are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        ts = float(value)
    except OverflowError:
        return None
    return ts if 0 <= ts < np.inf else None


def _stamp(text: str) -> float | None:
    try:
        return _milliseconds(json.loads(text).get("timestamp"))
    except (ValueError, AttributeError, RecursionError):
        return None


_DTYPES = (np.float64, np.int64, np.int64)


def _mooncake_chunks(path, t0, total, scale, shift, mml, too_long, chunk_size):
    emitted, copy, span = 0, 0, 0
    buf: tuple[list, list, list, list] = ([], [], [], [])
    cut: list[bool] = []
    while emitted < total:
        for line, ts, n_in, n_out, ids in _mooncake_records(path):
            if copy == 0 and ids:
                span = max(span, max(ids) + 1)
            if mml is not None:
                was = (n_in, n_out)
                if n_in > mml:
                    if too_long == "error":
                        raise TraceError(f"prompt of {n_in} tokens exceeds max_model_len {mml}",
                                         file=path, line=line, field="input_length")  # fmt: skip
                    n_in, ids = mml, ids[: -(-mml // MOONCAKE_BLOCK)]
                n_out = min(n_out, mml - n_in)
            cut.append(mml is not None and (n_in, n_out) != was)
            off = copy * span
            for col, v in zip(buf, ((ts - t0) / 1000 * scale + copy * shift, n_in, n_out,
                                    tuple(ids) if not off else tuple(h + off for h in ids))):
                col.append(v)
            emitted += 1
            if len(buf[0]) == chunk_size or emitted == total:
                t, p, o = (np.asarray(col, dtype) for col, dtype in zip(buf, _DTYPES))
                yield RequestChunk(t, p, o, buf[3], MOONCAKE_BLOCK, np.asarray(cut, dtype=bool))
                buf, cut = ([], [], [], []), []
                if emitted == total:
                    return
        copy += 1
