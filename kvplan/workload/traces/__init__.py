"""Request trace readers: each yields RequestChunks lazily.

The CSV formats are streamed in blocks of rows that numpy parses at once: a first pass validates
them (stopping at `limit` when the trace is not tiled) and keeps them as arrays when there are at
most KEEP_ROWS, else each chunk is read from the file again, so memory never grows with the
trace. Mooncake JSONL is streamed line by line the same way; the JSON formats (sharegpt, agentic,
vllm-bench: token counts only, at most 1 GiB) are parsed whole. Every trace is opened through
kvplan/fileio.py: regular files only, UTF-8 or gzip, bounded lines.

Formats (`open_trace(format, path)`):
- azure: CSV `TIMESTAMP,ContextTokens,GeneratedTokens` (Azure LLM inference 2023); TIMESTAMP is a
  date-time text such as `2023-11-16 18:17:03.9799600`.
- vidur: CSV `arrived_at,num_prefill_tokens,num_decode_tokens` (arrived_at in seconds), or the
  older `Date,Time,PromptTokenCount,CompletionTokenCount` (Time in seconds; every row of one Date,
  as Vidur replays one), told apart by the header; other columns are ignored.
- csv: any CSV with a header, read by a column mapping (`columns`, a TraceColumns: the header
  names of the arrival time and the prompt and output token counts, default `timestamp`,
  `prompt_tokens`, `output_tokens`) with times in seconds (default), ms, us or as date-times
  (`columns.unit`); other columns are ignored. See kvplan/workload/traces/columns.py.
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
- vllm-bench: a vLLM benchmark_serving / `vllm bench serve` result saved with `--save-result
  --save-detailed` (or SGLang bench_serving's `--output-details` JSONL, one run per line): the
  `input_lens` and `output_lens` lists, requests whose `errors` entry is not empty left out. No
  timestamps: every request arrives at 0 and the workload's arrival process spaces them.
- vllm-bench-timed: the same file of one run, arrivals `start_times[i] - queue_times[i]` (newer
  vLLM writes them), sorted.

Arrivals are seconds since the first request. Options: `time_scale` multiplies every gap (0.05 =
20x compressed); `repeat` tiles the trace, copy k shifted by k x (duration + mean gap) and, in
traces with hash ids, k x (largest id + 1) so copies do not share prefixes; `limit` keeps the
first N requests of the (tiled) stream. A prompt above `max_model_len` is an error, or with
`too_long="clip"` is truncated (its hash ids too); an output is always cut where prompt + output
would pass max_model_len, as vLLM stops generating there. Bad rows raise TraceError with the
file, line (or JSON field path) and column.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from kvplan.errors import TraceError, UsageError
from kvplan.fileio import input_path
from kvplan.workload.traces._rows import MOONCAKE_BLOCK, _Rows
from kvplan.workload.traces.bench_results import read_bench_result
from kvplan.workload.traces.columns import TraceColumns
from kvplan.workload.traces.csv_formats import csv_blocks
from kvplan.workload.traces.json_formats import _read_agentic, _read_sharegpt
from kvplan.workload.traces.mooncake import _mooncake_chunks, _mooncake_scan
from kvplan.workload.chunks import CHUNK_SIZE, RequestChunk

TRACE_FORMATS = ("azure", "mooncake", "vidur", "csv", "sharegpt", "agentic", "vllm-bench", "vllm-bench-timed")
CSV_FORMATS = ("azure", "vidur", "csv")
UNTIMED_FORMATS = ("sharegpt", "vllm-bench")  # no timestamps: arrivals come from the workload
KEEP_ROWS = 1_000_000  # CSV rows held in memory (32 MB); a longer trace is read again per chunk


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """An opened trace: its final request count and a factory of fresh chunk iterators."""

    format: str
    path: Path
    num_requests: int
    timed: bool  # False: the trace has no timestamps (UNTIMED_FORMATS); arrivals are all 0
    hash_block_size: int
    make_chunks: Callable[[], Iterator[RequestChunk]]

    def chunks(self) -> Iterator[RequestChunk]:
        return self.make_chunks()


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
    output = np.minimum(rows.output, mml - prompt)
    return replace(rows, prompt=prompt, output=output, hash_ids=ids,
                   cut=(prompt != rows.prompt) | (output != rows.output))


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
                           ids, rows.block_size if ids is not None else 0, _cut(rows, row))  # fmt: skip


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
    columns: TraceColumns | None = None, chunk_size: int = CHUNK_SIZE,
) -> Trace:  # fmt: skip
    """Open a trace (see the module docstring): validated now, streamed when it is long."""
    _check_options(fmt, limit, time_scale, repeat, too_long)
    path = input_path(path, TraceError, folder_ok=fmt == "agentic")
    try:
        if fmt == "mooncake":
            count, t0, t1 = _mooncake_scan(path, limit if repeat == 1 else None)
            total = min(limit or count * repeat, count * repeat)
            span = (t1 - t0) / 1000 * time_scale
            shift = span + (span / (count - 1) if count > 1 else 0.0)
            make = lambda: _mooncake_chunks(path, t0, total, time_scale, shift, max_model_len,
                                            too_long, chunk_size)  # noqa: E731  # fmt: skip
            return Trace(fmt, path, total, True, MOONCAKE_BLOCK, make)
        if fmt in CSV_FORMATS:
            if columns is not None and fmt != "csv":
                raise UsageError(f"columns apply to csv traces, not {fmt}")
            read = _CsvRead(fmt, path, time_scale, max_model_len, too_long, columns)
            return _open_csv(read, limit, repeat, chunk_size)
        if fmt == "agentic":
            rows = _read_agentic(path, time_scale, session_starts)
        elif fmt.startswith("vllm-bench"):
            rows = read_bench_result(path, timed=fmt == "vllm-bench-timed")
            rows = replace(rows, arrival=rows.arrival * time_scale)
        else:
            rows = _read_sharegpt(path, history)
            rows = replace(rows, arrival=rows.arrival * time_scale)
    except OSError as e:
        where = getattr(e, "filename", None) or path
        raise TraceError(f"cannot read: {e.strerror or e}", file=where) from None
    return _in_memory(fmt, path, _fit(rows, max_model_len, too_long), limit, repeat, chunk_size)


def _in_memory(fmt: str, path: Path, rows: _Rows, limit, repeat: int, chunk_size: int) -> Trace:
    """A trace held as arrays, tiled `repeat` times and cut at `limit` chunk by chunk."""
    n = len(rows.prompt)
    total = min(limit or n * repeat, n * repeat)
    span = float(rows.arrival[-1])
    shift = span + (span / (n - 1) if n > 1 else 0.0)
    return Trace(fmt, path, total, fmt not in UNTIMED_FORMATS, rows.block_size,
                 lambda: _tile_chunks(rows, total, shift, chunk_size))  # fmt: skip


@dataclass(frozen=True, slots=True)
class _CsvRead:
    """How a CSV trace's rows are read: its format, file, time scale, max_model_len rule, columns."""

    fmt: str
    path: Path
    time_scale: float
    mml: int | None
    too_long: str
    columns: TraceColumns | None

    def rows(self, chunk_size: int) -> Iterator[_Rows]:
        for rows in csv_blocks(self.fmt, self.path, chunk_size, self.columns):
            yield _fit(replace(rows, arrival=rows.arrival * self.time_scale), self.mml, self.too_long)


def _open_csv(read: _CsvRead, limit, repeat, chunk_size) -> Trace:
    """CSV traces: one validating pass (stopping at `limit` when not tiled); the rows are kept
    when they are few (at most KEEP_ROWS), else every chunk is read from the file again."""
    stop = limit if repeat == 1 else None
    kept: list[_Rows] | None = []
    count, last = 0, 0.0
    block = min(chunk_size, stop) if stop is not None else chunk_size  # read no row past `limit`
    for rows in read.rows(block):
        if stop is not None and count + len(rows.prompt) > stop:
            rows = _head(rows, stop - count)
        count += len(rows.prompt)
        last = float(rows.arrival[-1])
        if kept is not None:
            kept.append(rows)
            if count > KEEP_ROWS:
                kept = None
        if stop is not None and count >= stop:
            break
    if kept is not None:
        return _in_memory(read.fmt, read.path, _concat(kept), limit, repeat, chunk_size)
    total = min(limit or count * repeat, count * repeat)
    shift = last + (last / (count - 1) if count > 1 else 0.0)
    make = lambda: _streamed_chunks(read, chunk_size, total, shift)  # noqa: E731
    return Trace(read.fmt, read.path, total, True, 0, make)


def _streamed_chunks(read: _CsvRead, chunk_size, total, shift):
    emitted, copy = 0, 0
    while emitted < total:
        for rows in read.rows(chunk_size):
            take = min(len(rows.prompt), total - emitted)
            yield RequestChunk(rows.arrival[:take] + copy * shift, rows.prompt[:take],
                               rows.output[:take], cut=_cut(rows, slice(0, take)))
            emitted += take
            if emitted == total:
                return
        copy += 1


def _cut(rows: _Rows, which) -> np.ndarray | None:
    """Which of the rows picked by `which` max_model_len cut short."""
    return None if rows.cut is None else rows.cut[which]


def _head(rows: _Rows, n: int) -> _Rows:
    return replace(rows, arrival=rows.arrival[:n], prompt=rows.prompt[:n], output=rows.output[:n],
                   cut=None if rows.cut is None else rows.cut[:n])


def _concat(blocks: list[_Rows]) -> _Rows:
    """One _Rows of consecutive blocks; `where` finds the block of a row."""
    if len(blocks) == 1:
        return blocks[0]
    starts = np.cumsum([0] + [len(b.prompt) for b in blocks])

    def where(i: int) -> dict:
        b = int(np.searchsorted(starts, i, side="right")) - 1
        return blocks[b].where(i - int(starts[b]))

    cut = None
    if any(b.cut is not None for b in blocks):
        cut = np.concatenate([b.cut if b.cut is not None else np.zeros(len(b.prompt), bool) for b in blocks])
    return _Rows(np.concatenate([b.arrival for b in blocks]), np.concatenate([b.prompt for b in blocks]),
                 np.concatenate([b.output for b in blocks]), where, cut=cut)


def read_trace(fmt: str, path: str | Path, **options) -> Iterator[RequestChunk]:
    """Chunks of a trace: `open_trace(fmt, path, **options).chunks()`."""
    return open_trace(fmt, path, **options).chunks()
