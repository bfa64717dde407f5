"""Speed of one's own trace: a generic `csv` trace of 1,000,000 rows read through a column mapping,
with its times in epoch seconds, epoch milliseconds and as date-times, beside the Azure reader on
the same rows; and how long the bounded reader takes to refuse a 20 KB gzip of 20 MiB of blank
lines and a gzip bomb of valid records (issue 29: the blank lines were read three times, minutes).

Prints rows per second for each reading (the whole trace, chunk by chunk, as the engine reads it)
and the seconds to each refusal. The figure is machine-dependent; nothing here asserts it.

Run: python bench/trace_read.py
"""

from __future__ import annotations

import datetime
import gzip
import tempfile
import time
from pathlib import Path

from kvplan.errors import TraceError
from kvplan.workload.traces import open_trace
from kvplan.workload.traces.columns import TraceColumns

ROWS = 1_000_000
EPOCH = 1_717_200_000


def write(path: Path, header: str, stamp) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(header + "\n")
        for i in range(ROWS):
            f.write(f"{i},{stamp(i)},{100 + i % 997},{10 + i % 89}\n")


def date(i: int) -> str:
    return datetime.datetime.fromtimestamp(EPOCH + i * 0.02, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


def timed_read(fmt: str, path: Path, columns: TraceColumns | None) -> tuple[int, float]:
    t0 = time.perf_counter()
    trace = open_trace(fmt, path, columns=columns, max_model_len=8192)
    count = sum(len(c) for c in trace.chunks())
    return count, time.perf_counter() - t0


def timed_refusal(path: Path) -> tuple[str, float]:
    t0 = time.perf_counter()
    try:
        open_trace("mooncake", path)
    except TraceError as exc:
        return exc.message, time.perf_counter() - t0
    return "read (not refused)", time.perf_counter() - t0


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        cases = [
            ("csv, epoch s", "csv", root / "s.csv", "id,ts,input_len,output_len", lambda i: f"{EPOCH + i * 0.02:.3f}",
             TraceColumns("ts", "input_len", "output_len", "s")),
            ("csv, epoch ms", "csv", root / "ms.csv", "id,ts,input_len,output_len", lambda i: f"{EPOCH * 1000 + i * 20}",
             TraceColumns("ts", "input_len", "output_len", "ms")),
            ("csv, datetime", "csv", root / "dt.csv", "id,ts,input_len,output_len", date,
             TraceColumns("ts", "input_len", "output_len", "datetime")),
            ("azure", "azure", root / "az.csv", "id,TIMESTAMP,ContextTokens,GeneratedTokens", date, None),
        ]
        print(f"{ROWS:,} rows each")
        for label, fmt, path, header, stamp, columns in cases:
            write(path, header, stamp)
            count, seconds = timed_read(fmt, path, columns)
            print(f"  {label:<14} {count:>9,} requests in {seconds:5.2f} s: {count / seconds / 1e3:6.0f}k rows/s")
        blank = root / "blank.jsonl.gz"
        blank.write_bytes(gzip.compress(b"\n" * (20 << 20), 9))
        line = b'{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'
        bomb = root / "bomb.jsonl.gz"
        bomb.write_bytes(gzip.compress(line * ((64 << 20) // len(line)), 9))
        for label, path in (("20 MiB of blank lines", blank), ("64 MiB of one record", bomb)):
            message, seconds = timed_refusal(path)
            print(f"  {label} ({path.stat().st_size / 1e3:.0f} kB gzip): refused in {seconds:.2f} s: {message}")


if __name__ == "__main__":
    main()
