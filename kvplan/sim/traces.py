"""Request trace readers: each yields RequestChunks lazily.

The CSV formats are parsed once into numpy arrays and tiled chunk by chunk (a million tiled
requests never exist as a million Python objects); Mooncake JSONL is streamed line by line; the
JSON formats (sharegpt, agentic: token counts only, small) are parsed whole, then tiled the same way.

Formats (`open_trace(format, path)`):
- azure: CSV `TIMESTAMP,ContextTokens,GeneratedTokens` (Azure LLM inference 2023); TIMESTAMP is a
  date-time text such as `2023-11-16 18:17:03.9799600`.
- vidur: CSV `arrived_at,num_prefill_tokens,num_decode_tokens` (arrived_at in seconds; other
  columns are ignored).
- mooncake: JSONL, one `{"timestamp": ms, "input_length", "output_length", "hash_ids"}` per
  line, one hash id per 512-token prompt block (ceil(input_length / 512) of them, checked).
- sharegpt: a JSON list (or JSONL, one per line) of conversations with token counts, no text:
  `{"id": any, "conversations": [{"from": "human", "tokens": 12}, {"from": "gpt", "tokens": 80}]}`.
  One request per human turn followed by a reply: prompt = the human turn(s) since the last reply
  (plus the whole conversation before them with `history=True`), output = the reply. Roles:
  human|user ask, gpt|assistant|chatgpt|bard|bing|model reply, system adds to the prompt; a
  leading reply counts as history; a trailing unanswered turn is dropped. No timestamps: every
  request arrives at 0 and the workload's arrival process spaces them.
- agentic: kv-cache-tester JSON (a file, or a folder of `*.json`, one conversation each);
  `requests` entries `{t, in, out, hash_ids}` with one hash id per full `block_size`-token block
  (floor(in / block_size), checked); a `"subagent"` entry holds nested `requests` whose `t` counts
  from the entry's own `t`. Flattened and sorted by arrival. Each conversation starts at 0, or
  where `session_starts(n_files)` says. Hash ids are local to a file, so each file's are shifted
  to keep different files apart.

Arrivals are seconds since the first request. Options: `time_scale` multiplies every gap (0.05 =
20x compressed); `repeat` tiles the trace, copy k shifted by k x (duration + mean gap) and, in
traces with hash ids, k x (largest id + 1) so copies do not share prefixes; `limit` keeps the
first N requests of the (tiled) stream. A prompt above `max_model_len` is an error, or with
`too_long="clip"` is truncated (its hash ids too); an output is always cut where prompt + output
would pass max_model_len, as vLLM stops generating there. Bad rows raise TraceError with the
file, line (or JSON field path) and column.
"""

from __future__ import annotations

import csv
import json
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from kvplan.errors import TraceError, UsageError
from kvplan.sim.types import CHUNK_SIZE, RequestChunk

TRACE_FORMATS = ("azure", "mooncake", "vidur", "sharegpt", "agentic")
MOONCAKE_BLOCK = 512
MAX_JSON_BYTES = 1 << 30  # a whole-document JSON trace (sharegpt .json, one agentic file)
_ASK = {"human", "user", "system"}
_REPLY = {"gpt", "assistant", "chatgpt", "bard", "bing", "model"}


@dataclass(frozen=True, slots=True, eq=False)
class _Rows:
    """A parsed trace as arrays; `where(i)` locates row i for an error message."""

    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    where: Callable[[int], dict]
    hash_ids: list[tuple[int, ...]] | None = None
    block_size: int = 0
    hash_partial: bool = True  # the last, partial block has an id (mooncake) or not (agentic)


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """An opened trace: its final request count and a factory of fresh chunk iterators."""

    format: str
    path: Path
    num_requests: int
    timed: bool  # False: the trace has no timestamps (sharegpt); arrivals are all 0
    hash_block_size: int
    make_chunks: Callable[[], Iterator[RequestChunk]]

    def chunks(self) -> Iterator[RequestChunk]:
        return self.make_chunks()


def _int_or_none(text) -> int | None:
    """An integer from text or JSON (an integral float like 12.0 counts); None if not one."""
    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return text
    try:
        return int(text)
    except (TypeError, ValueError):
        try:
            v = float(text)
        except (TypeError, ValueError):
            return None
        return int(v) if v.is_integer() else None


# ---- CSV formats ---------------------------------------------------------------------------


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


# ---- JSON formats --------------------------------------------------------------------------


def _field_int(entry: dict, key: str, lo: int, fail) -> int:
    v = entry.get(key) if isinstance(entry, dict) else None
    n = _int_or_none(v) if isinstance(v, (int, float)) else None
    if n is None or n < lo:
        raise fail(key, f"expected an integer >= {lo}, got {json.dumps(v)}")
    return n


def _load_json(path: Path):
    if path.stat().st_size > MAX_JSON_BYTES:
        raise TraceError(f"larger than {MAX_JSON_BYTES >> 20} MiB; use the .jsonl form", file=path)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise TraceError(f"invalid JSON: {e}", file=path, line=getattr(e, "lineno", None)) from None


def _conversation_pairs(conv, history: bool, fail) -> Iterator[tuple[int, int]]:
    turns = conv.get("conversations") if isinstance(conv, dict) else None
    if not isinstance(turns, list):
        raise fail("conversations", "expected a list of turns")
    before = pending = 0
    for j, turn in enumerate(turns):
        role = turn.get("from") if isinstance(turn, dict) else None
        tokens = _field_int(turn, "tokens", 0, lambda k, m: fail(f"conversations[{j}].{k}", m))
        if role in _ASK:
            pending += tokens
        elif role in _REPLY:
            if pending:
                yield (before + pending if history else pending), tokens
            before, pending = before + pending + tokens, 0
        else:
            raise fail(f"conversations[{j}].from", f"unknown role {json.dumps(role)}")


def _sharegpt_conversations(path: Path) -> Iterator[tuple[dict, str, object]]:
    """(location, field prefix, conversation) from a JSON list or, streamed, a JSONL file."""
    if path.suffix == ".jsonl":
        with open(path, encoding="utf-8") as f:
            for line, text in enumerate(f, 1):
                if text.strip():
                    try:
                        conv = json.loads(text)
                    except ValueError as e:
                        raise TraceError(f"invalid JSON: {e}", file=path, line=line) from None
                    yield {"file": path, "line": line}, "", conv
        return
    data = _load_json(path)
    if not isinstance(data, list):
        raise TraceError("expected a JSON list of conversations", file=path)
    for i, conv in enumerate(data):
        yield {"file": path, "field": f"[{i}]"}, f"[{i}].", conv


def _read_sharegpt(path: Path, history: bool) -> _Rows:
    prompt, output, places = [], [], []
    for loc, prefix, conv in _sharegpt_conversations(path):
        line = loc.get("line")

        def fail(field, message, prefix=prefix, line=line):
            return TraceError(message, file=path, line=line, field=prefix + field)

        for p, o in _conversation_pairs(conv, history, fail):
            prompt.append(p)
            output.append(o)
            places.append(loc)
    if not prompt:
        raise TraceError("no human turn followed by a reply", file=path)
    p = np.asarray(prompt, dtype=np.int64)  # >= 1: turns of 0 tokens make no request
    return _Rows(np.zeros(len(p)), p, np.asarray(output, dtype=np.int64), places.__getitem__)


def _agentic_requests(entries, base_t: float, field: str, block: int, fail, out, depth=0):
    if not isinstance(entries, list) or depth > 8:
        raise fail(field, "expected a list of requests")
    prev = -np.inf
    for i, e in enumerate(entries):
        here = f"{field}[{i}]"
        bad = lambda k, m, here=here: fail(f"{here}.{k}", m)  # noqa: E731
        t = e.get("t") if isinstance(e, dict) else None
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < np.inf:
            raise bad("t", f"expected seconds >= 0, got {json.dumps(t)}")
        if t < prev:
            raise bad("t", f"goes backwards ({t} after {prev})")
        prev = t
        if e.get("type") == "subagent":
            _agentic_requests(e.get("requests"), base_t + t, f"{here}.requests", block, fail, out,
                              depth + 1)  # fmt: skip
            continue
        n_in, n_out = _field_int(e, "in", 1, bad), _field_int(e, "out", 0, bad)
        ids = e.get("hash_ids")
        if not isinstance(ids, list) or len(ids) != n_in // block:
            got = len(ids) if isinstance(ids, list) else json.dumps(ids)
            raise bad("hash_ids", f"expected floor(in / {block}) = {n_in // block} ids, got {got}")
        if not all(type(h) is int and h >= 0 for h in ids):
            raise bad("hash_ids", "expected integers >= 0")
        out.append((base_t + t, n_in, n_out, tuple(ids), here))


def _read_agentic(path: Path, scale: float, session_starts) -> _Rows:
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files:
        raise TraceError("no *.json files in the folder", file=path)
    starts = np.zeros(len(files)) if session_starts is None else session_starts(len(files))
    rows, block, id_base = [], None, 0
    for start, file in zip(starts, files):
        doc = _load_json(file)
        fail = lambda fld, m, file=file: TraceError(m, file=file, field=fld)  # noqa: E731
        size = _field_int(doc, "block_size", 1, fail)
        if block is not None and size != block:
            raise fail("block_size", f"{size} differs from {block} in {files[0].name}")
        block, mine = size, []
        _agentic_requests(doc.get("requests"), 0.0, "requests", size, fail, mine)
        top = max((max(r[3], default=-1) for r in mine), default=-1)
        rows += [(start + t * scale, i, o, tuple(h + id_base for h in ids), (file, fld))
                 for t, i, o, ids, fld in mine]  # fmt: skip
        id_base += top + 1
    if not rows:
        raise TraceError("the trace has no requests", file=path)
    arrival = np.asarray([r[0] for r in rows])
    order = np.argsort(arrival, kind="stable")
    pick = lambda k: [rows[j][k] for j in order]  # noqa: E731
    places = pick(4)
    return _Rows(arrival[order] - arrival[order[0]], np.asarray(pick(1), dtype=np.int64),
                 np.asarray(pick(2), dtype=np.int64), lambda i: {"file": places[i][0],
                 "field": places[i][1]}, pick(3), block, hash_partial=False)  # fmt: skip


# ---- mooncake: streamed ----------------------------------------------------------------------


def _mooncake_records(path: Path) -> Iterator[tuple[int, float, int, int, list]]:
    """(line, timestamp ms, input, output, hash_ids) per non-blank line, validated."""
    with open(path, encoding="utf-8") as f:
        prev = -np.inf
        for line, text in enumerate(f, 1):
            if not text.strip():
                continue
            fail = lambda k, m, n=line: TraceError(m, file=path, line=n, field=k)  # noqa: E731
            try:
                d = json.loads(text)
            except ValueError as e:
                raise fail(None, f"invalid JSON: {e}") from None
            if not isinstance(d, dict):
                raise fail(None, "expected a JSON object")
            ts = d.get("timestamp")
            if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not 0 <= ts < np.inf:
                raise fail("timestamp", f"expected milliseconds >= 0, got {json.dumps(ts)}")
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
    with open(path, "rb") as f:
        for text in f:
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


def _stamp(text: bytes) -> float | None:
    try:
        t = json.loads(text).get("timestamp")
    except (ValueError, AttributeError):
        return None
    return t if isinstance(t, (int, float)) and not isinstance(t, bool) else None


_DTYPES = (np.float64, np.int64, np.int64)


def _mooncake_chunks(path, t0, total, scale, shift, mml, too_long, chunk_size):
    emitted, copy, span = 0, 0, 0
    buf: tuple[list, list, list, list] = ([], [], [], [])
    while emitted < total:
        for line, ts, n_in, n_out, ids in _mooncake_records(path):
            if copy == 0 and ids:
                span = max(span, max(ids) + 1)
            if mml is not None:
                if n_in > mml:
                    if too_long == "error":
                        raise TraceError(f"prompt of {n_in} tokens exceeds max_model_len {mml}",
                                         file=path, line=line, field="input_length")  # fmt: skip
                    n_in, ids = mml, ids[: -(-mml // MOONCAKE_BLOCK)]
                n_out = min(n_out, mml - n_in)
            off = copy * span
            for col, v in zip(buf, ((ts - t0) / 1000 * scale + copy * shift, n_in, n_out,
                                    tuple(ids) if not off else tuple(h + off for h in ids))):
                col.append(v)
            emitted += 1
            if len(buf[0]) == chunk_size or emitted == total:
                t, p, o = (np.asarray(col, dtype) for col, dtype in zip(buf, _DTYPES))
                yield RequestChunk(t, p, o, buf[3], MOONCAKE_BLOCK)
                buf = ([], [], [], [])
                if emitted == total:
                    return
        copy += 1


# ---- in-memory formats: cap, then tile chunk by chunk -----------------------------------------


def _fit(rows: _Rows, mml: int | None, too_long: str) -> _Rows:
    """Apply max_model_len: error on (or clip) long prompts, cut outputs at the limit."""
    if mml is None:
        return rows
    prompt, ids = rows.prompt, rows.hash_ids
    over = np.flatnonzero(prompt > mml)
    if over.size and too_long == "error":
        i = int(over[0])
        raise TraceError(f"prompt of {prompt[i]} tokens exceeds max_model_len {mml} (set the "
                         "trace's too_long: clip, or a larger max_model_len)", **rows.where(i))
    if over.size:
        prompt = np.minimum(prompt, mml)
        if ids is not None:
            keep = -(-mml // rows.block_size) if rows.hash_partial else mml // rows.block_size
            ids = list(ids)
            for i in over.tolist():
                ids[i] = ids[i][:keep]
    return replace(rows, prompt=prompt, output=np.minimum(rows.output, mml - prompt), hash_ids=ids)


def _tile_chunks(rows: _Rows, total: int, shift: float, chunk_size: int) -> Iterator[RequestChunk]:
    n = len(rows.prompt)
    span = 1 + max((max(h, default=-1) for h in rows.hash_ids), default=-1) if rows.hash_ids else 0
    for begin in range(0, total, chunk_size):
        idx = np.arange(begin, min(begin + chunk_size, total))
        copy, row = np.divmod(idx, n)
        ids = None
        if rows.hash_ids is not None:
            ids = [rows.hash_ids[r] if not c else tuple(h + c * span for h in rows.hash_ids[r])
                   for r, c in zip(row.tolist(), copy.tolist())]  # fmt: skip
        yield RequestChunk(rows.arrival[row] + copy * shift, rows.prompt[row], rows.output[row],
                           ids, rows.block_size if ids is not None else 0)  # fmt: skip


def _check_options(fmt, limit, time_scale, repeat, too_long) -> None:
    if fmt not in TRACE_FORMATS:
        names = ", ".join(TRACE_FORMATS)
        raise UsageError(f"unknown trace format {fmt!r}; expected one of {names}")
    if limit is not None and (isinstance(limit, bool) or limit < 1):
        raise UsageError(f"limit must be an integer >= 1, got {limit!r}")
    if not (0 < time_scale < np.inf):
        raise UsageError(f"time_scale must be a finite number > 0, got {time_scale!r}")
    if isinstance(repeat, bool) or repeat < 1:
        raise UsageError(f"repeat must be an integer >= 1, got {repeat!r}")
    if too_long not in ("error", "clip"):
        raise UsageError(f"too_long must be error or clip, got {too_long!r}")


def open_trace(
    fmt: str, path: str | Path, *, limit: int | None = None, time_scale: float = 1.0,
    repeat: int = 1, max_model_len: int | None = None, too_long: str = "error",
    history: bool = False, session_starts: Callable[[int], np.ndarray] | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> Trace:  # fmt: skip
    """Open a trace (see the module docstring); parses it now unless it is streamed (mooncake)."""
    _check_options(fmt, limit, time_scale, repeat, too_long)
    path = Path(path)
    if not path.exists():
        raise TraceError("no such file or folder", file=path)
    if not (path.is_file() or path.is_dir()):
        raise TraceError("not a regular file (a device or pipe could be endless)", file=path)
    try:
        if fmt == "mooncake":
            count, t0, t1 = _mooncake_scan(path, limit if repeat == 1 else None)
            total = min(limit or count * repeat, count * repeat)
            span = (t1 - t0) / 1000 * time_scale
            shift = span + (span / (count - 1) if count > 1 else 0.0)
            make = lambda: _mooncake_chunks(path, t0, total, time_scale, shift, max_model_len,
                                            too_long, chunk_size)  # noqa: E731  # fmt: skip
            return Trace(fmt, path, total, True, MOONCAKE_BLOCK, make)
        if fmt == "agentic":
            rows = _read_agentic(path, time_scale, session_starts)
        else:
            reader = {"azure": _read_azure, "vidur": _read_vidur}.get(fmt)
            rows = reader(path) if reader else _read_sharegpt(path, history)
            rows = replace(rows, arrival=rows.arrival * time_scale)
    except OSError as e:
        where = getattr(e, "filename", None) or path
        raise TraceError(f"cannot read: {e.strerror or e}", file=where) from None
    rows = _fit(rows, max_model_len, too_long)
    n = len(rows.prompt)
    total = min(limit or n * repeat, n * repeat)
    span = float(rows.arrival[-1])
    shift = span + (span / (n - 1) if n > 1 else 0.0)
    return Trace(fmt, path, total, fmt != "sharegpt", rows.block_size,
                 lambda: _tile_chunks(rows, total, shift, chunk_size))  # fmt: skip


def read_trace(fmt: str, path: str | Path, **options) -> Iterator[RequestChunk]:
    """Chunks of a trace: `open_trace(fmt, path, **options).chunks()`."""
    return open_trace(fmt, path, **options).chunks()
